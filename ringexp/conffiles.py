"""What an option file may do: set training values, never run code. Checked inside Hydra's own composition.

Hydra instantiates whatever `_target_` it finds under `hydra.callbacks` (and the launcher and the sweeper), and
`logging.config.dictConfig` calls any `'()'` factory of `hydra.job_logging` (a `FileHandler` in mode `w`
truncates any file the user can write), as soon as it has composed a command, before ringexp sees it. A group option
file that reaches under `hydra` could run code, even for a command ringexp then refuses; and ringexp tells users to
copy a file it writes (a tune's `best.yaml`) into `conf/experiment/`. A list of ways to reach under `hydra` (package
headers, a defaults entry's `@package`, `_global_`, a search path the command adds) keeps leaking, so the check is
not made beside Hydra but inside it: while `gate()` is open, every composition Hydra performs (an app's, each job of
its sweep, the compose API's) checks each file as Hydra reads it and where Hydra puts it:

- the file is read once, through ringexp's reader (UTF-8, at most records.SMALL bytes, no YAML alias, nesting
  bounded, a header Hydra can read): what Hydra parses is what was checked, and a malformed file is one line;
- a training values file (any option but the primary config, a program's config it composes from ringexp's conf/
  (conf/train.yaml in plan's and the tune's) and the `hydra/` options) reaches under `hydra` only at
  MAY_SET (a sweep's values, the run and sweep directories), holds no `_target_` and no `'()'` anywhere, selects no
  `hydra/` option in its defaults list, and its sweep sets no `hydra` key;
- the primary config and the `hydra/` options come from ringexp's conf/, Hydra's package, a Hydra plugin's package
  or a schema registered in Python: never from a directory the command line adds (`--config-dir`,
  `hydra.searchpath`).

What the command line itself says is the user's own (`hydra/launcher=slurm`, a `hydra.callbacks` override): it is
not a file. A sweep's master composition also composes each value of each sweep once, so that a file a sweep selects
is refused before its first job runs (every job's own composition is checked again as it starts). A refusal is
`Refused` inside Hydra (a BaseException: Hydra reports any Exception in its own words, exit code 1) and ConfigError
(ringexp's one line, exit code 2) once out of the gate.
"""

import contextlib
import copy
import io
import os

import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins.file_config_source import FileConfigSource
from hydra._internal.sources_registry import SourcesRegistry
from hydra.core.default_element import ConfigDefault, GroupDefault
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.errors import HydraException
from hydra.plugins.config_source import ConfigResult, ConfigSource
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp import records
from ringexp.config import CONF_DIR
from ringexp.errors import ConfigError, one_line

MAY_SET = (("sweeper", "params"), ("run", "dir"), ("sweep", "dir"), ("sweep", "subdir"))  # under hydra, by a file
CODE_KEYS = ("_target_", "()")  # what Hydra instantiates, what logging's dictConfig calls
TRUSTED = (f"file://{os.path.realpath(CONF_DIR)}", "pkg://hydra.", "pkg://hydra_plugins.", "structured://")
PRECHECKED = 64  # a sweep's values composed before its first job: more is left to each job's own check
HEADER = 512  # the characters Hydra reads a file's header (`# @package ...`) from

_PLACE, _COMPOSE = ConfigLoaderImpl._load_single_config, ConfigLoaderImpl.load_configuration
_READ = FileConfigSource.load_config  # (the same function as the registered class's: see file_source)
_open = [0]  # gates open (they nest: a program's gate, then the compose API inside its app)
# (config name, overrides) of the sweep values composed ahead of their jobs while the outermost gate is open: Hydra
# composes a sweep's master configuration twice (its mode, then the sweep), and the values need composing once
_prechecked = set()


class Refused(BaseException):
    """An option file that does more than set values, raised where Hydra composes."""


@contextlib.contextmanager
def gate():
    """Every composition Hydra performs inside checks each file it loads (see the module's doc); a refused file is a
    ConfigError out of the gate."""
    source = file_source()
    if not _open[0]:
        _prechecked.clear()
        source.load_config, ConfigLoaderImpl._load_single_config = read, place
        ConfigLoaderImpl.load_configuration = composed
    _open[0] += 1
    try:
        yield
    except Refused as e:
        raise ConfigError(str(e)) from None
    finally:
        _open[0] -= 1
        if not _open[0]:
            source.load_config, ConfigLoaderImpl._load_single_config = _READ, _PLACE
            ConfigLoaderImpl.load_configuration = _COMPOSE


def file_source():
    """The class Hydra reads `file://` sources with: its plugin scan imports the module again, so the class it
    registers is not the one `import` gives (Plugins.instance() scans once; Hydra then finds it done)."""
    Plugins.instance()
    return SourcesRegistry.instance().resolve("file")


@contextlib.contextmanager
def conf_hydra():
    """Hydra over ringexp's conf/: the app's already running (its search path), else one for this block."""
    if GlobalHydra.instance().is_initialized():
        yield
    else:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            yield


def compose(overrides: list, config_name: str = "train") -> DictConfig:
    """Hydra's compose API (nothing run, configured or instantiated) through the gate: ConfigError naming a file
    that does more than set values, or saying in one line what Hydra cannot compose (a sweep, `glob()`, a key that
    is not there): inside another program's app, Hydra would report it as that job's failure."""
    try:
        with gate(), conf_hydra():
            return hydra_compose(config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise composition_error(e) from None


def composition_error(e: Exception) -> ConfigError:
    """Hydra's or OmegaConf's error as one line: its lines joined (Hydra's "Ambiguous value" says what to do on the
    lines after the first), and its cause, which says what is wrong where the first only names the override ("Error
    merging override x=.inf")."""
    said = "; ".join(x.strip().rstrip(".") for x in str(e).splitlines() if x.strip())
    cause = f": {one_line(str(e.__cause__))}" if e.__cause__ else ""
    return ConfigError(said + cause)


def check(args: list, config_name: str = "train") -> None:
    """Compose a command line of `config_name`'s program (`-m`: a sweep, each of its values composed once) through
    the gate, running nothing: ConfigError naming the first option file that does more than set values. What Hydra
    cannot compose is left to the program itself, which says it in Hydra's words."""
    mode = RunMode.MULTIRUN if any(a in ("-m", "--multirun") for a in args) else RunMode.RUN
    try:
        with gate(), conf_hydra():
            GlobalHydra.instance().hydra.compose_config(config_name, [a for a in args if not a.startswith("-")], mode)
    except (HydraException, OmegaConfBaseException):
        pass


def sweeps(args: list) -> list:
    """The overrides of `args` that sweep (`a,b`, `glob()`, `range()`), as given; [] where Hydra cannot parse them
    (its own message follows)."""
    try:
        return [o.input_line for o in OverridesParser.create().parse_overrides(args) if o.is_sweep_override()]
    except HydraException:
        return []


def read(source, config_path: str) -> ConfigResult:
    """FileConfigSource.load_config with the file read once, by ringexp's reader."""
    path = os.path.realpath(os.path.join(source.path, source._normalize_file_name(config_path)))
    if not os.path.isfile(path):
        return _READ(source, config_path)  # (Hydra's own answer: not there)
    try:
        text = records.yaml_text(path, records.read_bytes(path, follow=True), mapping=False)
        header = ConfigSource._get_header_dict(text[:HEADER])
        body = OmegaConf.load(io.StringIO(text))
    except OSError as e:
        raise Refused(f"{path}: cannot read it ({e.strerror or e})") from None
    except ConfigError as e:  # (its words say what to do)
        raise Refused(str(e)) from None
    except yaml.MarkedYAMLError as e:  # what only building it finds (a duplicate key)
        line = f" (line {e.problem_mark.line + 1})" if e.problem_mark else ""
        raise Refused(f"{path}: {e.problem or e.context}{line}; fix the file") from None
    except (ValueError, yaml.YAMLError, OmegaConfBaseException) as e:  # a header or a value Hydra cannot take
        raise Refused(f"{path}: {one_line(str(e))}; fix the file") from None
    return ConfigResult(config=body, path=f"{source.scheme()}://{source.path}", provider=source.provider,
                        header=header)


def place(loader, default, repo) -> ConfigResult:
    """ConfigLoaderImpl._load_single_config, then the file checked as Hydra placed it (its final package)."""
    res = _PLACE(loader, default, repo)
    where = f"{res.path.removeprefix('file://')}/{default.config_path}.yaml"
    if default.primary or default.config_path.startswith("hydra/"):
        if not trusted(res.path):
            what = "its primary config" if default.primary else "the hydra/ options"
            raise Refused(f"{where}: ringexp takes {what} only from its own conf/, Hydra and Hydra's plugins, not "
                          "from a folder the command line adds; remove it from that folder")
        return res
    if "/" not in default.config_path and trusted(res.path):  # a program's own config (train.yaml in plan's, the
        return res  # tune's), its hydra settings ringexp's
    values_only(where, res, default.config_path)
    return res


def trusted(source: str) -> bool:
    if source.startswith("file://"):
        source = "file://" + os.path.realpath(source.removeprefix("file://"))
    return source == TRUSTED[0] or source.startswith(TRUSTED[1:])


def values_only(where: str, res: ConfigResult, config_path: str) -> None:
    """Refused unless the placed file `res` only sets training values (and a sweep's, and where runs go)."""
    body = res.config
    if isinstance(body, DictConfig) and "hydra" in body:
        if (key := beyond(body._get_node("hydra"), ())) is not None:
            refuse(where, f"it sets hydra.{'.'.join(key)}")
        sweep(where, OmegaConf.select(body, "hydra.sweeper.params") or {})
    if (key := code_key(body, ())) is not None:
        refuse(where, f"it sets {'.'.join(key)}, which Hydra or logging would call")
    base = config_path.rsplit("/", 1)[0] if "/" in config_path else ""
    for d in res.defaults_list or []:
        if isinstance(d, ConfigDefault) and d.is_self():
            continue
        d = copy.deepcopy(d)
        d.update_parent(base, "")  # (what Hydra does first: a path is relative to the file's group)
        name = d.get_group_path() if isinstance(d, GroupDefault) else d.get_config_path()
        if name.lstrip("/").startswith("hydra"):
            refuse(where, f"its defaults list selects {name}")


def beyond(node, at: tuple):
    """The first key under `hydra` outside MAY_SET (a path), or None."""
    if at in MAY_SET:
        return None
    if not isinstance(node, DictConfig) or not any(m[:len(at)] == at for m in MAY_SET):
        return at
    for key in node.keys():
        if (found := beyond(node._get_node(key), (*at, str(key)))) is not None:
            return found
    return None


def sweep(where: str, params) -> None:
    """A file's sweep (hydra.sweeper.params) is overrides of every job: none of them may reach under hydra."""
    try:
        jobs = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    except (HydraException, AttributeError):
        refuse(where, "its hydra.sweeper.params are no overrides Hydra can read")
    for o in jobs:
        key, _, package = o.key_or_group.lstrip("+~").partition("@")
        if key.startswith("hydra") or (o.package or package).startswith("hydra"):
            refuse(where, f"its sweep sets {o.get_key_element()}")


def code_key(node, at: tuple):
    """The path of the first `_target_` or `'()'` key in `node`, or None (values left unresolved)."""
    if isinstance(node, DictConfig):
        for key in node.keys():
            if key in CODE_KEYS:
                return (*at, str(key))
            if (found := code_key(node._get_node(key), (*at, str(key)))) is not None:
                return found
    elif isinstance(node, ListConfig):
        for i, item in enumerate(node._iter_ex(resolve=False)):
            if (found := code_key(item, (*at, str(i)))) is not None:
                return found
    return None


def composed(loader, config_name, overrides, run_mode, *args, **kwargs):
    """ConfigLoaderImpl.load_configuration; for a sweep's master configuration, each value of each sweep composed
    once too (files checked as they load), so that a file a job would select is refused before any job runs."""
    cfg = _COMPOSE(loader, config_name, overrides, run_mode, *args, **kwargs)
    if run_mode == RunMode.MULTIRUN:
        for job in list(values(overrides, cfg))[:PRECHECKED]:
            if (config_name, tuple(job)) in _prechecked:
                continue
            _prechecked.add((config_name, tuple(job)))
            try:
                _COMPOSE(loader, config_name, job, RunMode.RUN)
            except (HydraException, OmegaConfBaseException):
                pass  # (the job itself says it, in Hydra's words)
    return cfg


def values(overrides: list, cfg):
    """Overrides that select one value of one sweep each (the command line's and hydra.sweeper.params'), the other
    overrides kept as they are."""
    parser = OverridesParser.create()
    given = parser.parse_overrides(overrides)
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    sweeps = [o for o in given if o.is_sweep_override()]
    sweeps += [o for o in parser.parse_overrides([f"{k}={v}" for k, v in params.items()]) if o.is_sweep_override()]
    kept = [o.input_line for o in given if not o.is_sweep_override()]
    for o in sweeps:
        try:
            choices = list(o.sweep_string_iterator())
        except (HydraException, TypeError, ValueError):  # glob(): the options are the group's, known to the job
            continue
        yield from ([*kept, f"{o.get_key_element()}={v}"] for v in choices)


def refuse(where: str, why: str):
    raise Refused(f"{where}: {why}; a config file may only set training values (docs/faults.md: what a config file "
                  "can do). Remove it from the file, or give it on the command line")
