"""What a config file may do: set training values, never run code.

Hydra instantiates whatever `_target_` it finds under `hydra.callbacks` (and the launcher, the sweeper, the logging
handlers) as soon as it has composed a command, before ringexp sees the configuration. A group option file that
puts keys under `hydra` (with `# @package _global_`, or a package of `hydra...`) can therefore run any importable
function (`torch.hub.load` on a `hubconf.py` runs that file), even for a command that ringexp then refuses; and
ringexp tells users to copy a file it writes (a tune's `best.yaml`) into `conf/experiment/`. So, before Hydra
composes anything, every option file the command line selects (`+experiment=best`, `parallel=X`, each value of a
sweep, and what their defaults lists pull in) is read as Hydra would find it (its search path, `hydra.searchpath`
included) and refused, in one line naming the file, when it holds a `_target_`, keys under `hydra` other than a
sweep's values (`hydra.sweeper.params`), or a defaults entry of a `hydra/` group. What the command line itself
says is the user's own (a `hydra/launcher=` choice, a `hydra.callbacks` override).

Hydra's own repository (hydra._internal) does the finding, so that the file checked is the file Hydra loads.
"""

from hydra._internal.config_repository import ConfigRepository
from hydra._internal.utils import create_config_search_path
from hydra.core.default_element import ConfigDefault, GroupDefault
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf

from ringexp.config import CONF_DIR
from ringexp.errors import ConfigError

SWEEP_VALUES = ("hydra", "sweeper", "params")  # the one part of `hydra` a file may set: a sweep's values
DEPTH = 8  # defaults lists pulling in defaults lists: deeper than any shipped option, and no loop


def check(args: list) -> None:
    """ConfigError naming the first option file of command line `args` that does more than set values."""
    overrides = parse([a for a in args if not a.startswith("-")])
    if overrides is not None:  # (else Hydra's own message follows when it parses them)
        selected(ConfigRepository(config_search_path=search_path(overrides)), overrides, 0)


def parse(args: list):
    try:
        return OverridesParser.create().parse_overrides(args)
    except HydraException:
        return None


def selected(repo, overrides, depth: int) -> None:
    """Check every option file that `overrides` select (hydra/ groups aside: those are the command line's own)."""
    for o in overrides:
        group, _, package = o.key_or_group.lstrip("+~").partition("@")
        if o.is_delete() or group.startswith("hydra") or not repo.group_exists(group):
            continue
        for option in options(o):
            walk(repo, f"{group}/{option}", package or None, depth)


def search_path(overrides):
    """Hydra's search path for this command: conf/, then what `hydra.searchpath=[...]` adds."""
    path = create_config_search_path(CONF_DIR)
    for o in overrides:
        if o.key_or_group == "hydra.searchpath" and not o.is_sweep_override():
            for entry in o.value() or []:
                path.append("command-line", str(entry))
    return path


def options(o) -> list:
    """The option names an override selects (each value of a sweep)."""
    if o.is_sweep_override():
        return [str(v) for v in o.sweep_string_iterator()]
    value = o.value()
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def walk(repo, path: str, package, depth: int) -> None:
    """Check option file `path` (group/option) and what its defaults list includes."""
    got = repo.load_config(path) if depth <= DEPTH else None
    if got is None:
        return  # not an option file (Hydra's own message follows), or too deep to be a real configuration
    where = f"{got.path.removeprefix('file://')}/{path}.yaml"
    base = path.rsplit("/", 1)[0]
    package = package or got.header.get("package") or base.replace("/", ".")
    if package == "hydra" or package.startswith("hydra."):
        refuse(where, f"its package {package} puts its keys under hydra")
    body = got.config
    if package.startswith("_global_") and isinstance(body, DictConfig) and "hydra" in body:
        hydra_keys(where, body.hydra, ("hydra",))
        sweep(repo, where, OmegaConf.select(body, "hydra.sweeper.params") or {}, depth)
    if (target := find_target(body, ())) is not None:
        refuse(where, f"it sets {'.'.join(target) or '_target_'}, which Hydra would instantiate")
    for d in got.defaults_list or []:
        if isinstance(d, ConfigDefault) and d.is_self():
            continue
        d.update_parent(base, package)  # (what Hydra does first: a path is relative to the file's group)
        name = d.get_group_path() if isinstance(d, GroupDefault) else d.get_config_path()
        if name.lstrip("/").startswith("hydra"):
            refuse(where, f"its defaults list selects {name}")
        if isinstance(d, ConfigDefault) or not (d.is_missing() or d.is_options()):
            walk(repo, d.get_config_path().lstrip("/"), None, depth + 1)


def sweep(repo, where: str, params, depth: int) -> None:
    """A file's sweep (hydra.sweeper.params) is overrides of every job: each one checked as if given here."""
    jobs = parse([f"{k}={v}" for k, v in params.items()])
    if jobs is None:
        refuse(where, "its hydra.sweeper.params are no overrides Hydra can read")
    if (bad := next((o.key_or_group for o in jobs if o.key_or_group.lstrip("+~").startswith("hydra")), None)):
        refuse(where, f"its sweep sets {bad}")
    selected(repo, jobs, depth + 1)


def hydra_keys(where: str, node, at: tuple) -> None:
    """Every key under `hydra` in a file must lie inside hydra.sweeper.params."""
    if at == SWEEP_VALUES[:len(at)] and len(at) == len(SWEEP_VALUES):
        return
    if not isinstance(node, DictConfig) or at != SWEEP_VALUES[:len(at)]:
        refuse(where, f"it sets {'.'.join(at)}")
    for key in node:
        hydra_keys(where, node[key], (*at, str(key)))


def find_target(node, at: tuple):
    """The path of the first `_target_` key in `node`, or None."""
    if isinstance(node, DictConfig):
        for key in node.keys():
            if key == "_target_":
                return (*at, "_target_")
            if (found := find_target(node._get_node(key), (*at, str(key)))) is not None:
                return found
    elif isinstance(node, ListConfig):
        for i, item in enumerate(node._iter_ex(resolve=False)):
            if (found := find_target(item, (*at, str(i)))) is not None:
                return found
    return None


def refuse(where: str, why: str):
    raise ConfigError(f"{where}: {why}; a config file may only set training values (docs/faults.md: what a config "
                      "file can do). Remove it from the file, or give it on the command line")
