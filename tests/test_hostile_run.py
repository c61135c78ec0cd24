"""What someone who can write a run directory or an image folder can do to a run, and cannot: a folder of images
swapped for a link while the run reads it, a log file Hydra cannot open, backend variables that make NCCL or torch
write files, and symlinks planted at the names a run writes (its logs, rows, configs, checkpoints, traces)."""

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.processes import error_line, refused, run_cli
from helpers.runs import TINY, make_image_folder
from PIL import Image

from ringexp import backend
from ringexp.config import BackendConfig
from ringexp.data.image_folder import ImageFolderMultiLabel, read_labels
from ringexp.errors import DataError
from ringexp.records import read_rows, read_summary
from ringexp.validate import compose_config


def folder_with_subfolder(root: Path, n: int = 4) -> Path:
    """make_image_folder's images moved into root/sub, the CSV naming them there."""
    make_image_folder(root, n=n)
    (root / "sub").mkdir()
    for i in range(n):
        (root / f"img{i}.png").rename(root / "sub" / f"img{i}.png")
    (root / "labels.csv").write_text("path,cat\n" + "".join(f"sub/img{i}.png,{i % 2}\n" for i in range(n)))
    return root


def test_a_subfolder_swapped_for_a_link_during_a_run_is_not_read(tmp_path):
    root = folder_with_subfolder(tmp_path / "images")
    outside = make_image_folder(tmp_path / "outside", n=4)
    make_other_images(outside)  # other images under the same names
    paths, _, labels = read_labels(SimpleNamespace(root=str(root), csv=None, path_column="path", label_columns=[]))
    ds = ImageFolderMultiLabel(str(root), paths, labels, 8)
    skip = ImageFolderMultiLabel(str(root), paths, labels, 8, skip_bad=True)
    own = ds[0][0]
    theirs = ImageFolderMultiLabel(str(outside), ["img0.png"], [[1.0]], 8)[0][0]
    assert not torch.equal(own, theirs)

    shutil.rmtree(root / "sub")  # checked before launch; swapped while the run reads it
    os.symlink(outside, root / "sub")
    for i in range(4):
        with pytest.raises(DataError) as e:
            ds[i]
        message = str(e.value)
        assert message.startswith(f"{root}/sub/img{i}.png: cannot read image (") and "symbolic link" in message
        assert skip[i] is None  # data.skip_bad: dropped and counted like any unreadable image

    os.unlink(root / "sub")  # a real folder again, but one image in it a link to an outside file
    (root / "sub").mkdir()
    for i in range(4):
        shutil.copy(outside / f"img{i}.png", root / "sub" / f"img{i}.png")
    os.unlink(root / "sub" / "img1.png")
    os.symlink(outside / "img1.png", root / "sub" / "img1.png")
    with pytest.raises(DataError, match=r"sub/img1\.png: cannot read image \(.*symbolic link"):
        ds[1]
    assert torch.equal(ds[0][0], theirs)  # (a plain file there is read as ever)


def make_other_images(folder: Path) -> None:
    """Overwrite folder's img*.png with images of another seed than make_image_folder's."""
    rng = torch.Generator().manual_seed(1)
    for p in sorted(folder.glob("img*.png")):
        Image.fromarray(torch.randint(0, 255, (20, 20, 3), generator=rng, dtype=torch.uint8).numpy()).save(p)


@pytest.mark.parametrize("filename, words", [
    ("/proc/x/log", "hydra.job_logging.handlers.file.filename=/proc/x/log: cannot write there (No such file or "
                    "directory)"),
    ("{tmp}/no-such-folder/train.log", "hydra.job_logging.handlers.file.filename={tmp}/no-such-folder/train.log: "
                                       "cannot write there (no folder {tmp}/no-such-folder)"),
])
def test_a_log_file_hydra_cannot_open_is_one_line_before_anything_is_made(tmp_path, filename, words):
    r = refused(tmp_path / "run", f"hydra.job_logging.handlers.file.filename={filename.format(tmp=tmp_path)}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert error_line(r.stderr).startswith(f"ringexp: error: {words.format(tmp=tmp_path)}; pick a file"), r.stderr
    assert not (tmp_path / "run").exists()


# Variables that make NCCL or torch write a file (following a link at its name), read one, or load code from one
FILE_VARIABLES = {
    "NCCL_DEBUG_FILE": "names a file the backend writes", "NCCL_TOPO_DUMP_FILE": "names a file the backend writes",
    "NCCL_GRAPH_DUMP_FILE": "names a file the backend writes", "NCCL_PROFILE_DUMP_FILE": "names a file the backend "
    "writes", "NCCL_INSPECTOR_DUMP_DIR": "names a file the backend writes",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "names a file the backend writes",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "names a file the backend writes",
    "NCCL_TUNER_CONFIG_FILE": "names a library or file the backend loads", "NCCL_IBVERBS_LIB": "names a library or "
    "file the backend loads", "NCCL_EP_HOME": "names a library or file the backend loads",
    "NCCL_SOMETHING_NEW_FILE": "names a file or folder the backend reads or writes",
    "UCC_CONFIG_FILE": "names a file or folder the backend reads or writes",
}


def test_backend_variables_naming_files_are_refused_unless_allowed(tmp_path, monkeypatch):
    for key, words in FILE_VARIABLES.items():
        r = refused(tmp_path / key, f"+backend.env.{key}=/tmp/victim")
        assert r.returncode == 2, (key, r.stderr[-2000:])
        line = error_line(r.stderr)
        assert line.startswith(f"ringexp: error: backend.env.{key}=/tmp/victim: {words}") and \
            line.endswith("; set backend.allow_plugins=true if you trust it"), line
        assert not (tmp_path / key).exists()
        b = compose_config([f"+backend.env.{key}=/tmp/victim", "backend.allow_plugins=true"]).backend
        assert b.env == {key: "/tmp/victim"}
    # ringexp's own NCCL log (NCCL_DEBUG on, no NCCL_DEBUG_FILE): a fresh file of this worker's, made before NCCL
    # opens it, so that no link planted at a name known in advance is written through
    monkeypatch.setenv("NCCL_DEBUG_FILE", "")  # (set, so that the teardown takes away what backend.apply sets:
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", "")  # a later test in this process would see NCCL_DEBUG=INFO)
    monkeypatch.setenv("NCCL_DEBUG", "")
    got = backend.apply(BackendConfig("nccl_debug", {"NCCL_DEBUG": "INFO"}))
    log = Path(got["env"]["NCCL_DEBUG_FILE"])
    assert got["from"]["NCCL_DEBUG_FILE"] == "ringexp" and log.is_file() and not log.is_symlink()
    assert log.stat().st_uid == os.getuid() and log.stat().st_size == 0
    log.unlink()


# A run of 6 steps with a checkpoint every 3 and a row every step, resumed to 9 with a profiler trace
SHORT = [o for o in TINY if not o.startswith(("steps", "eval_every"))] + [
    "steps=6", "eval_every=3", "checkpoint.every_steps=3", "logger=none"]
LONGER = [*SHORT, "steps=9", "resume=auto", "profile.enabled=true", "profile.start_step=7", "profile.steps=2"]
APPENDED = ["metrics.jsonl", "rank0.log", "rank1.log", "train.log", ".ringexp.lock", "checkpoints", "workers"]
WHOLE = ["config.yaml", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "val_scores.pt",
         "trace_rank0.json", "checkpoints/step-00000009.tmp", "checkpoints/step-00000009"]


def snapshot(folder: Path) -> dict:
    """Every path under `folder` with what it is: a link's target, a file's bytes, a directory."""
    out = {}
    for p in sorted(folder.rglob("*")):
        out[str(p.relative_to(folder))] = (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file()
                                           else "dir")
    return out


def plant(run_dir: Path, name: str, outside: Path) -> Path:
    """A symlink at run_dir/name to a file (or, for a folder's name, a folder) outside, which holds 'victim'."""
    target = outside / name.replace("/", "_")
    folder = name in ("checkpoints", "workers") or name.startswith("checkpoints/")
    if folder:
        target.mkdir()
        (target / "keep.txt").write_text("victim\n")
    else:
        target.write_text("victim\n")
    if (run_dir / name).is_file():  # (the run's own file, replaced by the link)
        (run_dir / name).unlink()
    (run_dir / name).symlink_to(target, target_is_directory=folder)
    return target


@pytest.mark.slow
def test_links_planted_in_a_run_directory_are_never_written_through(tmp_path):
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    r = run_cli(run_dir, *SHORT)
    assert r.returncode == 0, r.stderr[-3000:]
    for name in APPENDED:  # appended to by a resumption: refused before anything starts, nothing changed
        aside = tmp_path / "aside"
        (run_dir / name).rename(aside)
        target = plant(run_dir, name, outside)
        before = snapshot(run_dir)
        r = refused(run_dir, *LONGER)
        assert r.returncode == 2, (name, r.stderr[-2000:])
        assert error_line(r.stderr) == (f"ringexp: error: {run_dir / name}: a symbolic link, which ringexp does not "
                                        "write through; remove it (what it points to is left as it is), or pick "
                                        "another hydra.run.dir"), r.stderr
        assert snapshot(run_dir) == before and snapshot(outside)[target.name] == (
            "dir" if target.is_dir() else b"victim\n")
        (run_dir / name).unlink()
        aside.rename(run_dir / name)
    for name in WHOLE:  # written whole by the resumption: the link itself replaced, what it points to untouched
        plant(run_dir, name, outside)
    outside_before = snapshot(outside)
    r = run_cli(run_dir, *LONGER)
    assert r.returncode == 0, r.stderr[-3000:]
    assert snapshot(outside) == outside_before, "a file outside the run directory was written"
    still = [n for n in WHOLE if (run_dir / n).is_symlink()]
    assert not still, still
    assert not os.path.lexists(run_dir / "checkpoints/step-00000009.tmp")
    assert (run_dir / "checkpoints/step-00000009/meta.json").is_file()
    assert b"steps: 9" in (run_dir / "config.yaml").read_bytes() and b"resume=auto" in (
        run_dir / ".hydra/overrides.yaml").read_bytes()
    assert read_summary(run_dir)["status"] == "completed" and (run_dir / "trace_rank0.json").stat().st_size > 0
    assert [row["step"] for row in read_rows(run_dir)] == list(range(1, 10)), "every step exactly once"
