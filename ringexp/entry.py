"""How a program starts (python -m ringexp.train, .bench, .plan, .tune): its Hydra app, every option file checked
as Hydra reads it (ringexp.conffiles), on rank 0 or where no external launcher runs it, and on the other ranks of a
torchrun job the same composition without Hydra's app (launch.as_rank); what it refuses is ringexp's one line and
exit 2, Ctrl-C one line and stop's exit code, never a traceback."""

import sys

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser

from ringexp import conffiles, stop
from ringexp.config import CONF_DIR
from ringexp.errors import ConfigError, print_error
from ringexp.launch import as_rank


def run(app, other=None, srun: bool = True, args: list | None = None):
    """`app()` (the program's Hydra app), or `other()` on a non-zero rank of an external launcher (None: `app`),
    inside conffiles' gate; its return value. `args`: the command line's arguments (None: sys.argv's)."""
    try:
        check_argv(sys.argv[1:] if args is None else args)
        with conffiles.gate():
            return as_rank(app, other or app, srun=srun)
    except ConfigError as e:
        print_error(str(e))
        sys.exit(2)
    except KeyboardInterrupt:
        print_error("interrupted")
        sys.exit(stop.EXIT_CODE)


def hydra_app(config_name: str, prog: str, args: list, body) -> None:
    """`body(cfg)` in Hydra's app over conf/`config_name`.yaml and `args` (its overrides and flags, --help), the app
    named `prog`: for a program whose command line holds more than its own config's keys (plan's command and
    training overrides, the tune's training overrides). A ConfigError inside is one line and exit 2 there, where
    Hydra would otherwise report it with its own traceback."""
    saved, sys.argv = sys.argv, [prog, *args]  # what Hydra's app parses

    @hydra.main(version_base="1.3", config_path=CONF_DIR, config_name=config_name)
    def app(cfg) -> None:
        try:
            body(cfg)
        except ConfigError as e:
            print_error(str(e))
            sys.exit(2)

    try:
        app()
    finally:
        sys.argv = saved


def overrides(args: list) -> list:
    """The composition's own overrides among a command line's arguments: Hydra's (hydra.*, hydra/..., its flags)
    left out, as a rank composing without Hydra's app takes them."""
    return [a for a in args if not a.startswith(("hydra.", "hydra/", "-"))]


def others(overrides: list, own) -> list:
    """The overrides (Hydra's parsed) whose key is none of `own` and under none of them: the training overrides a
    program composing the training config with its own keys passes on (the tune's trials, plan predict's presets)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [o.input_line for o in parsed if o.key_or_group not in own and o.key_or_group.split(".")[0] not in own]


def one_run(args: list, why: str) -> None:
    """ConfigError where the command line asks for more than one run (-m, a sweep among its overrides) of a program
    that runs once: outside Hydra's app, which would take -m as a sweep of the program or refuse the sweep in its
    words."""
    if any(a in ("-m", "--multirun") for a in args):
        raise ConfigError(f"-m: {why}; drop -m")
    if swept := conffiles.sweeps(overrides(args)):
        raise ConfigError(f"{swept[0]}: a sweep; {why}: give one value")


def check_argv(args: list) -> None:
    """What Hydra itself answers with a traceback rather than a message: an override without a key (`=3`)."""
    for a in args:
        if not a.startswith("-") and "=" in a and not a.split("=", 1)[0].lstrip("+~"):
            raise ConfigError(f"override '{a}' has no key; write KEY=VALUE (e.g. steps=100)")
