"""Option files that would run code, checked inside Hydra's composition (ringexp/conffiles.py): every route a hostile
or careless file has taken under `hydra` (a package header, `_global_.hydra`, a defaults entry's `@package`, a sweep's
values, a folder added with --config-dir or hydra.searchpath, a hydra/ option from such a folder), in every program
that composes option files (train, tune, bench, plan), each refused with one line and exit code 2 before anything
runs; a malformed or alias-bombed file is one line too; a file swapped between two reads is checked as it is read."""

import ast
import contextlib
import io
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.processes import ON_OPEN, ROOT, error_line, refused
from helpers.runs import TINY

from ringexp import conffiles
from ringexp.errors import ConfigError
from ringexp.tune import cli

TASK = [o for o in TINY if not o.startswith("logger.")] + ["logger=none"]
MAY_ONLY = "a config file may only set training values"
HUBCONF = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n\ndef x(**kwargs):\n    return None\n"
HUB = "torch.hub.load\n{i}  repo_or_dir: {{hub}}\n{i}  model: x\n{i}  source: local\n{i}  trust_repo: true\n"
# Each would make Hydra, or logging's dictConfig, run code (the hub's hubconf.py, which leaves a marker) or truncate a
# file, as soon as it composed the command: {file name: (its text, what the refusal says)}.
EVIL = {
    "callbacks": ("# @package _global_\nsteps: 5\nhydra:\n  callbacks:\n    evil:\n      _target_: "
                  + HUB.format(i="    "),
                  "callbacks.yaml: it sets hydra.callbacks"),
    "package": ("# @package hydra.callbacks\nevil:\n  _target_: " + HUB.format(i=""), "package.yaml: it sets hydra"),
    "global_hydra": ("# @package _global_.hydra\ncallbacks:\n  evil:\n    _target_: " + HUB.format(i="  "),
                     "global_hydra.yaml: it sets hydra.callbacks"),
    "hub": ("evil:\n  _target_: " + HUB.format(i=""), "hub.yaml: it sets experiment.evil._target_"),
    "entry": ("# @package _global_\ndefaults:\n  - /experiment@hydra.callbacks: hub\nsteps: 5\n",
              "hub.yaml: it sets hydra.callbacks"),
    "target": ("# @package _global_\nmodel:\n  init:\n    _target_: " + HUB.format(i="  "),
               "it sets model.init._target_"),
    "factory": ("# @package _global_.hydra.job_logging\nversion: 1\nhandlers:\n  evil:\n    (): " + HUB.format(i="  ")
                + "root:\n  handlers: [evil]\n", "factory.yaml: it sets hydra.job_logging"),
    "truncate": ("# @package _global_.hydra\njob_logging:\n  version: 1\n  handlers:\n    f:\n"
                 "      class: logging.FileHandler\n      filename: {victim}\n      mode: w\n"
                 "  root:\n    handlers: [f]\n", "truncate.yaml: it sets hydra.job_logging"),
    "defaults": ("# @package _global_\ndefaults:\n  - override /hydra/job_logging: disabled\nsteps: 5\n",
                 "its defaults list selects hydra/job_logging"),
    "sweep": ("# @package _global_\nhydra:\n  sweeper:\n    params:\n      +experiment@hydra.callbacks: package\n",
              "its sweep sets +experiment@hydra.callbacks"),
}
VICTIM = "a file the user can write, which a FileHandler in mode w would empty\n"


@pytest.fixture
def evil(tmp_path):
    """conf/experiment/ of hostile files, a hydra/job_logging option of its own, a local torch hub whose hubconf.py
    leaves a marker if it runs, and a victim file: (conf folder, marker, victim)."""
    hub, marker, victim = tmp_path / "hub", tmp_path / "PWNED", tmp_path / "victim.txt"
    hub.mkdir()
    (hub / "hubconf.py").write_text(HUBCONF.format(marker=str(marker)))
    victim.write_text(VICTIM)
    exp, logging = tmp_path / "conf" / "experiment", tmp_path / "conf" / "hydra" / "job_logging"
    exp.mkdir(parents=True)
    logging.mkdir(parents=True)
    for name, (text, _) in EVIL.items():
        (exp / f"{name}.yaml").write_text(text.format(hub=hub, victim=victim))
    (logging / "evil.yaml").write_text(("version: 1\nhandlers:\n  evil:\n    (): " + HUB.format(i="  ")
                                        + "root:\n  handlers: [evil]\n").format(hub=hub))
    return tmp_path / "conf", marker, victim


def untouched(tmp_path, marker, victim) -> bool:
    return not marker.exists() and victim.read_text() == VICTIM and not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", list(EVIL))
def test_a_file_that_would_run_code_is_refused_before_hydra_instantiates_anything(tmp_path, evil, name):
    conf, marker, victim = evil
    args = [*TASK, f"+experiment={name}", f"hydra.searchpath=[file://{conf}]"]
    r = refused(tmp_path / "run", *(["-m", *args] if name == "sweep" else args))
    line = error_line(r.stderr)
    assert r.returncode == 2 and EVIL[name][1] in line and MAY_ONLY in line and str(conf) in line, line
    assert untouched(tmp_path, marker, victim), "code ran, a file was truncated or the run directory was made"


@pytest.mark.parametrize("args", [["--config-dir", "{conf}", "+experiment=global_hydra"],
                                  ["-m", "--config-dir", "{conf}", "+experiment=steps5,global_hydra"],
                                  ["--config-dir", "{conf}", "hydra/job_logging=evil"]])
def test_a_folder_added_on_the_command_line_is_read_through_the_same_check(tmp_path, evil, args):
    """--config-dir adds a search path: its option files are checked as any other, and a hydra/ option from it is
    refused whoever selects it (ringexp takes those from its conf/, Hydra and Hydra's plugins). A sweep is refused
    before its first job runs."""
    conf, marker, victim = evil
    (conf / "experiment" / "steps5.yaml").write_text("# @package _global_\nsteps: 5\n")
    r = refused(tmp_path / "run", *[a.format(conf=conf) for a in args], *TASK)  # (flags first, as argparse wants)
    line = error_line(r.stderr)
    assert r.returncode == 2 and (MAY_ONLY in line or "takes the hydra/ options only from its own conf/" in line)
    assert untouched(tmp_path, marker, victim), line


def test_every_program_that_composes_option_files_refuses_the_same_file(tmp_path, evil):
    """The tune (its training overrides, before anything is written), the bench (it had no check) and the planner's
    training overrides go through the one gate as ringexp.train does."""
    conf, marker, victim = evil
    file = [f"hydra.searchpath=[file://{conf}]", "+experiment=global_hydra"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main([*TASK, *file, f"tune.out={tmp_path / 'tune'}"])
    assert code == 2 and "global_hydra.yaml: it sets hydra.callbacks" in err.getvalue(), err.getvalue()
    assert not (tmp_path / "tune").exists()
    for program, args in (("ringexp.bench", [*file, f"hydra.run.dir={tmp_path / 'bench'}"]),
                          ("ringexp.plan", ["predict", "cluster=local_2x1_100mbit", *file])):
        r = subprocess.run([sys.executable, "-m", program, *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 2 and "global_hydra.yaml: it sets hydra.callbacks" in error_line(r.stderr), r.stderr
    assert untouched(tmp_path, marker, victim) and not (tmp_path / "bench").exists()


def test_every_hydra_app_and_composition_in_ringexp_passes_through_the_gate():
    """A future program too: a module that runs a Hydra app is entered through ringexp.entry.run, which holds
    conffiles.gate(), and only conffiles composes with Hydra's compose API."""
    assert "with conffiles.gate():" in (ROOT / "ringexp" / "entry.py").read_text()
    for path in (ROOT / "ringexp").rglob("*.py"):
        text = path.read_text()
        if "@hydra.main" in text and path.name != "entry.py":  # (entry.hydra_app: the gate is entry.run's)
            entry = path.parent / "__main__.py" if path.name == "__init__.py" else path
            assert "entry.run(" in entry.read_text() + text, f"{path}: a Hydra app not entered through entry.run"
        imported = {a.name for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom) and n.module == "hydra"
                    for a in n.names}
        assert path.name == "conffiles.py" or "compose" not in imported, f"{path}: composes outside the gate"


@pytest.mark.parametrize("text, says", [
    ("a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
     "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n", "a YAML alias"),
    ("# @package _global_ twice\nsteps: 5\n", "Too many components"),
    ("# @package _global_\nsteps: [5\n", "not valid YAML"),
    ("# @package _global_\nsteps: 5\nsteps: 6\n", "duplicate key"),
    ("\xff\xfe steps: 5\n", "not UTF-8"),
])
def test_a_malformed_or_exploding_option_file_is_one_line_at_once(tmp_path, text, says):
    """A 1 KB alias bomb (9^5 lists once built) used to hang the command; a bad header or YAML was a traceback."""
    exp = tmp_path / "conf" / "experiment"
    exp.mkdir(parents=True)
    (exp / "bad.yaml").write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    started = time.monotonic()
    r = refused(tmp_path / "run", *TASK, "+experiment=bad", f"hydra.searchpath=[file://{tmp_path / 'conf'}]")
    line = error_line(r.stderr)
    assert r.returncode == 2 and says in line and "bad.yaml" in line, line
    assert time.monotonic() - started < 20 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("at", [1, 2])
def test_a_file_swapped_between_two_reads_is_checked_as_it_is_read(tmp_path, evil, at):
    """Hydra reads an option file once per composition, and composes a command more than once (its mode, then the
    run). A check made once beside Hydra never sees a file swapped in between: each read is checked."""
    conf, marker, victim = evil
    swapped = conf / "experiment" / "benign.yaml"
    swapped.write_text("# @package _global_\nsteps: 5\n")
    opens = []

    def swap():  # an attacker who rewrites the file just before the program opens it for the at-th time
        opens.append(1)
        if len(opens) < at:
            return True
        swapped.write_text(EVIL["global_hydra"][0].format(hub=tmp_path / "hub"))  # (no longer watched: ON_OPEN)

    ON_OPEN[str(swapped)] = swap
    try:
        r = refused(tmp_path / "run", *TASK, "+experiment=benign", f"hydra.searchpath=[file://{conf}]")
    finally:
        ON_OPEN.clear()
    assert r.returncode == 2 and "benign.yaml: it sets hydra.callbacks" in error_line(r.stderr), r.stderr
    assert untouched(tmp_path, marker, victim)


def test_the_shipped_experiments_and_a_tunes_best_yaml_are_accepted(tmp_path):
    exp = tmp_path / "conf" / "experiment"
    exp.mkdir(parents=True)
    (exp / "best.yaml").write_text("# @package _global_\nparallel:\n  strategy: ring\naccumulation:\n  steps: 2\n"
                                   "steps: 6\neval_every: 3\nhydra:\n  run:\n    dir: outputs/best\n")
    conffiles.check(["+experiment=best", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"])
    for name in sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")):
        conffiles.check(["-m", f"+experiment={name}"])
    with pytest.raises(ConfigError, match="global_hydra.yaml: it sets hydra.callbacks"):
        (exp / "global_hydra.yaml").write_text(EVIL["global_hydra"][0].format(hub=tmp_path))
        conffiles.check(["+experiment=global_hydra", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"])
    assert Path(conffiles.CONF_DIR) == ROOT / "conf"
