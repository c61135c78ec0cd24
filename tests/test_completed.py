"""A completed run's records are never rewritten, and checkpoint metadata of any shape is skipped or refused in one
line: each case made from a real completed run (12 steps, checkpoints at 4, 8 and 12), broken as an unlucky or a
hostile user would break it; each asserts that every file of the run is as it was."""

import json
import shutil

import pytest
from helpers.processes import error_line, run_cli
from helpers.runs import TINY
from hydra import compose, initialize_config_dir

from ringexp import checkpoint
from ringexp.config import CONF_DIR
from ringexp.errors import ConfigError
from ringexp.train import prepare

pytestmark = pytest.mark.slow  # one real run of the CLI, shared (the fast tier is -m 'not slow')

CK = [*TINY, "steps=12", "checkpoint.every_steps=4", "checkpoint.keep=3", "logger=none"]


@pytest.fixture(scope="module")
def completed(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("completed") / "run"
    r = run_cli(run_dir, *CK)
    assert r.returncode == 0, r.stderr[-2000:]
    return run_dir


def files(run_dir) -> dict:
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def copy(completed, tmp_path, name="run"):
    shutil.copytree(completed, tmp_path / name)
    return tmp_path / name


def refused(run_dir, *overrides) -> str:
    """What prepare (everything the CLI checks before any worker starts) says for these overrides."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*CK, *overrides])
    with pytest.raises(ConfigError) as e:
        prepare(cfg, run_dir)
    return str(e.value)


def edit_meta(ckpt, hostile: bool, **changes) -> None:
    """meta.json with `changes`: by accident (its own checksum then disagrees) or by someone who recomputes it."""
    meta = json.loads((ckpt / "meta.json").read_text())
    meta.update(changes)
    meta = {k: v for k, v in meta.items() if v is not ...}
    if hostile:
        meta["sha256"] = checkpoint.meta_digest(meta)
    (ckpt / "meta.json").write_text(json.dumps(meta))


def test_resume_with_fewer_steps_than_a_completed_run_is_refused_and_changes_nothing(completed, tmp_path):
    """The CLI itself: nothing of the run changes, Hydra's .hydra/ files included (Hydra rewrites them before the
    task runs: ringexp writes them once it has accepted the command)."""
    run_dir = copy(completed, tmp_path)
    before = files(run_dir)
    r = run_cli(run_dir, *CK, "steps=5", "resume=auto")
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{run_dir} holds a completed run of 12 steps; raise steps above 12" in error_line(r.stderr)
    assert files(run_dir) == before


@pytest.mark.parametrize("case", ["meta.json lost", "checkpoints removed", "step -5", "step 5.5 (hostile)"])
def test_a_completed_run_without_its_last_checkpoint_is_never_restarted_over(case, completed, tmp_path):
    run_dir = copy(completed, tmp_path)
    ckpts = checkpoint.complete(run_dir)
    if case == "meta.json lost":
        for c in ckpts:
            (c / "meta.json").unlink()
    elif case == "checkpoints removed":
        shutil.rmtree(run_dir / "checkpoints")
    else:  # only the newest: resume=auto would fall back to step 8 and cut the completed run's rows to 8
        edit_meta(ckpts[-1], hostile="hostile" in case, step=-5 if "-5" in case else 5.5)
    before = files(run_dir)
    said = refused(run_dir, "steps=16", "resume=auto")
    assert f"{run_dir} holds a completed run of 12 steps" in said, said
    assert ("its newest intact checkpoint is at step 8" if "step" in case else "no intact checkpoint") in said, said
    assert files(run_dir) == before


def test_another_runs_checkpoint_is_not_resumed_into_a_completed_run(completed, tmp_path):
    run_dir, other = copy(completed, tmp_path), copy(completed, tmp_path, "other")
    before = files(run_dir)
    theirs = checkpoint.complete(other)[-1]
    said = refused(run_dir, "steps=16", f"resume={theirs}")
    assert f"resume={theirs} is another run's checkpoint, and {run_dir} already holds a run" in said, said
    assert files(run_dir) == before
    assert prepare_ok(tmp_path / "new", "steps=16", f"resume={theirs}")  # into a new directory: a copy continues


def prepare_ok(run_dir, *overrides) -> bool:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*CK, *overrides])
    return prepare(cfg, run_dir) is not None


SHAPES = {  # meta.json of any shape -> what damage() says (all: resume=auto skips the checkpoint)
    "no files list (legacy or stripped)": (dict(files=...), "lists no files, so none of them can be verified"),
    "step null": (dict(step=None), "holds step=None"),
    "step 1e400": (dict(step=float("inf")), "holds step=inf"),
    "step a string": (dict(step="12"), "holds step='12'"),
    "nested 100000 deep": ("[" * 100000 + "]" * 100000, "meta.json cannot be read (JSON nested too deeply)"),
    "a list": ([], "is not a checkpoint's meta"),
    "a file named ../x": (dict(files={"../x": {"bytes": 1, "sha256": "0" * 64}}), "malformed file list"),
    "an unknown strategy": (dict(strategy="evil"), "names strategy='evil'"),
}


@pytest.mark.parametrize("case", list(SHAPES))
@pytest.mark.parametrize("hostile", [False, True])
def test_checkpoint_metadata_of_any_shape_is_named_and_skipped(case, hostile, completed, tmp_path):
    run_dir = copy(completed, tmp_path)
    newest = checkpoint.complete(run_dir)[-1]
    change, words = SHAPES[case]
    if isinstance(change, dict):
        edit_meta(newest, hostile, **change)
    else:
        (newest / "meta.json").write_text(change if isinstance(change, str) else json.dumps(change))
    said = checkpoint.damage(newest)
    expected = words if hostile or not isinstance(change, dict) else "does not match its own SHA-256"
    assert said is not None and expected in said, said
    found, skipped = checkpoint.find("auto", run_dir)
    assert found.name == "step-00000008" and skipped[0].startswith(f"{newest.name}: meta.json"), skipped


def test_a_checkpoint_file_that_is_a_fifo_a_symlink_or_unlisted_is_damaged(completed, tmp_path):
    """Nothing a checkpoint holds is read unless it is a regular file meta.json lists (a FIFO would hang the
    reader, a symlink lead outside the run)."""
    run_dir = copy(completed, tmp_path)
    newest = checkpoint.complete(run_dir)[-1]
    (newest / "rank1.pt").unlink()
    (newest / "rank1.pt").symlink_to(checkpoint.complete(run_dir)[0] / "rank1.pt")
    assert "rank1.pt cannot be read (a symbolic link" in checkpoint.damage(newest)
    (newest / "rank1.pt").unlink()
    import os

    os.mkfifo(newest / "rank1.pt")
    assert "rank1.pt cannot be read (not a regular file)" in checkpoint.damage(newest)
    (newest / "rank1.pt").unlink()
    shutil.copy(checkpoint.complete(completed)[-1] / "rank1.pt", newest / "rank1.pt")
    assert checkpoint.damage(newest) is None
    (newest / "extra.distcp").write_bytes(b"x")
    assert checkpoint.damage(newest) == "extra.distcp is not listed in meta.json (added afterwards)"


@pytest.mark.parametrize("case", ["invalid UTF-8 in a row", "a row nested too deeply", "summary.json nested"])
def test_records_resume_cannot_read_are_named_and_left_as_they_are(case, completed, tmp_path):
    run_dir = copy(completed, tmp_path)
    if case == "summary.json nested":
        (run_dir / "summary.json").write_text("[" * 100000 + "]" * 100000)
        name = "summary.json"
    else:
        rows = (run_dir / "metrics.jsonl").read_bytes().splitlines(keepends=True)
        rows[3] = b'{"step": 4, "x": "\xff\xfe"}\n' if "UTF-8" in case else b"[" * 100000 + b"\n"
        (run_dir / "metrics.jsonl").write_bytes(b"".join(rows))
        name = "metrics.jsonl:4"
    before = files(run_dir)
    said = refused(run_dir, "steps=16", "resume=auto")
    assert f"{run_dir}/{name}" in said and "\n" not in said and len(said) < 400, said
    assert files(run_dir) == before
