"""Hostile and broken inputs: checkpoints damaged or planted, Ctrl-C at any moment, a full disk while resuming, two
runs in one directory, unwritable run directories, images that are bombs or 16 bits deep. Each case made by the
test itself; each asserts the one line, the exit code, that nothing already written was lost, and that no process
is left."""

import dataclasses
import hashlib
import json
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np
import pytest
import torch
from helpers.processes import ROOT, alive, descendants, error_line, refused, run_cli, worker_pid, workers
from helpers.runs import RUN, TINY, start, wait_for_step
from PIL import Image

from ringexp import checkpoint
from ringexp.data.image_folder import ImageFolderMultiLabel, image_folder_splits
from ringexp.records import read_rows, read_summary
from ringexp.validate import compose_config

pytestmark = pytest.mark.slow  # real runs of the CLI (the fast tier is -m 'not slow')

CK = [*TINY, "steps=12", "checkpoint.every_steps=4", "checkpoint.keep=3", "logger=none"]


def warnings(stderr: str) -> list:
    return [x for x in stderr.splitlines() if x.startswith("ringexp: warning:")]


def test_damaged_checkpoints_are_found_before_anything_is_loaded(tmp_path):
    src = tmp_path / "src"
    r = run_cli(src, *CK)
    assert r.returncode == 0, r.stderr[-2000:]
    step4, step8, step12 = sorted((src / "checkpoints").glob("step-*"))
    model = step12 / "model.pt"
    size = model.stat().st_size
    model.write_bytes(model.read_bytes()[: size // 2])  # cut in half
    # ... in a run that died after its last checkpoint (a completed one is never continued from an earlier
    # checkpoint: tests/test_completed.py)
    (src / "summary.json").write_text(json.dumps({"status": "failed", "error": "killed"}))

    # resume=auto skips it, says which and why, and continues from the newest intact one
    r = run_cli(src, *CK, "steps=16", "resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    said = warnings(r.stderr)
    assert len(said) == 1 and (f"skipping damaged checkpoint step-00000012: model.pt is {size // 2} bytes, meta.json "
                               f"says {size} (cut short or replaced); continuing from step-00000008") in said[0], said
    s = read_summary(src)
    assert s["status"] == "completed" and s["resumed_from"]["step"] == 8, s["resumed_from"]
    assert s["resumed_from"]["skipped"][0].startswith("step-00000012: model.pt is")
    assert [row["step"] for row in read_rows(src)] == list(range(1, 17))

    # an explicit resume=PATH that is damaged: one line naming the file; nothing written anywhere else
    newest = sorted((src / "checkpoints").glob("step-*"))[-1]
    (newest / "rank1.pt").unlink()
    r = refused(tmp_path / "explicit", *CK, "steps=20", f"resume={newest}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{newest}/rank1.pt is missing" in error_line(r.stderr) and "W&B" not in r.stderr, r.stderr
    rank0 = step8 / "rank0.pt"  # a byte changed, size kept
    data = bytearray(rank0.read_bytes())
    data[100] ^= 0xFF
    rank0.write_bytes(bytes(data))
    r = refused(tmp_path / "flipped", *CK, "steps=20", f"resume={step8}")
    assert r.returncode == 2 and f"{rank0.name} does not match its SHA-256" in error_line(r.stderr), r.stderr

    # every checkpoint damaged: resume=auto refuses, and the completed summary and rows stay as they were
    for ckpt in (src / "checkpoints").glob("step-*"):
        (ckpt / "meta.json").write_text(json.dumps({"fingerprint": {}, "files": {"model.pt": {"bytes": 1}}}))
    summary, rows = (src / "summary.json").read_bytes(), (src / "metrics.jsonl").read_bytes()
    r = refused(src, *CK, "steps=24", "resume=auto")
    assert r.returncode == 2 and "every checkpoint in" in error_line(r.stderr), r.stderr[-2000:]
    assert (src / "summary.json").read_bytes() == summary and (src / "metrics.jsonl").read_bytes() == rows


class Planted:
    """A pickle that, if unpickled, runs a shell command (writes a marker file)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def forge(ckpt, name: str, data: bytes) -> None:
    """Write `data` as file `name` of checkpoint `ckpt` and make meta.json match it, its own checksum included,
    as an attacker who can write the directory (and read ringexp's source) would."""
    (ckpt / name).write_bytes(data)
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    meta["sha256"] = checkpoint.meta_digest(meta)
    (ckpt / "meta.json").write_text(json.dumps(meta))


def byte_item(ckpt, fqn: str):
    """(file name, offset, length) of the non-tensor item `fqn` of an FSDP checkpoint, read from its .metadata."""
    metadata = pickle.loads((ckpt / ".metadata").read_bytes())
    info = next(v for k, v in metadata.storage_data.items() if k.fqn == fqn)
    return info.relative_path, info.offset, info.length


def test_a_planted_or_cut_fsdp_checkpoint_runs_no_code_and_is_named(tmp_path):
    """torch's DCP reader unpickles `.metadata` with plain pickle, and non-tensor items with weights_only=False, and
    opens whatever file `.metadata` names: ringexp checks every file against meta.json, reads `.metadata` with an
    unpickler of its own, opens only the checkpoint's own files and loads items as plain values. Each attacker below
    rewrote meta.json to match; each resumption is refused before launch, naming the file, and runs no code."""
    src = tmp_path / "src"
    r = run_cli(src, *TINY, "+parallel=fsdp", "steps=4", "checkpoint.every_steps=2", "logger=none")
    assert r.returncode == 0, r.stderr[-2000:]
    older, newest = sorted((src / "checkpoints").glob("step-*"))
    marker = tmp_path / "PWNED"
    planted = pickle.dumps(Planted(marker))
    original = (newest / ".metadata").read_bytes()
    (newest / ".metadata").write_bytes(planted)
    again = [*TINY, "+parallel=fsdp", "steps=6", "logger=none", f"resume={newest}"]
    r = refused(tmp_path / "checksum", *again)
    assert r.returncode == 2 and f".metadata is {len(planted)} bytes" in error_line(r.stderr), r.stderr[-2000:]

    def refused_as(name, words):
        r = refused(tmp_path / name, *again)
        assert not marker.exists(), f"the checkpoint ran code ({name})"
        assert r.returncode == 2 and words in error_line(r.stderr), r.stderr[-3000:]
        assert not (tmp_path / name).exists(), "a refused resumption made a run directory"

    forge(newest, ".metadata", planted)  # 1. .metadata itself a pickle that runs a command
    refused_as("unpickler", f"{newest / '.metadata'}: refused to load: it asks for posix.system")

    forge(newest, ".metadata", original)  # 2. a byte item (the learning rate) that runs a command
    shard, offset, length = byte_item(newest, "optimizer.param_groups.0.lr")
    shard_bytes = (newest / shard).read_bytes()
    data = bytearray(shard_bytes)
    data[offset:offset + len(planted)] = planted
    forge(newest, shard, bytes(data))
    refused_as("byte_item", f"{newest / shard}: item 'optimizer.param_groups.0.lr' cannot be loaded as plain values")

    # 3. .metadata pointing an item at a pickle outside the checkpoint
    outside = tmp_path / "elsewhere.distcp"
    outside.write_bytes(planted)
    metadata = pickle.loads(original)
    for index, info in metadata.storage_data.items():
        if index.fqn == "optimizer.param_groups.0.lr":
            metadata.storage_data[index] = dataclasses.replace(info, relative_path=str(outside), offset=0,
                                                               length=len(planted))
    forge(newest, ".metadata", pickle.dumps(metadata))
    refused_as("outside", f"{newest / '.metadata'}: item 'optimizer.param_groups.0.lr' is stored as '{outside}'")

    # 4. a tensor's bytes made unreadable: DCP fails inside its collective with a CheckpointException, a
    # BaseException that passed through `except Exception` as a traceback
    forge(newest, ".metadata", original)
    index = next(k for k, v in pickle.loads(original).storage_data.items() if k.fqn.startswith("model."))
    info = pickle.loads(original).storage_data[index]
    data = bytearray(shard_bytes if info.relative_path == shard else (newest / info.relative_path).read_bytes())
    data[info.offset:info.offset + 64] = bytes(64)
    forge(newest, info.relative_path, bytes(data))
    if info.relative_path != shard:
        forge(newest, shard, shard_bytes)
    r = run_cli(tmp_path / "tensor", *again)
    assert r.returncode != 0 and f"resume: {newest}: the shards cannot be loaded (" in error_line(r.stderr), \
        r.stderr[-3000:]

    shard = sorted(older.glob("*.distcp"))[-1]
    shard.write_bytes(shard.read_bytes()[:100])
    r = refused(tmp_path / "cut", *TINY, "+parallel=fsdp", "steps=6", "logger=none", f"resume={older}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{older}/{shard.name} is 100 bytes" in error_line(r.stderr), r.stderr[-2000:]


def test_one_run_per_directory(tmp_path):
    """A second run started into a directory while the first writes there, or after it ended without resume,
    gets one line and exit 2, and changes nothing the first one wrote."""
    run_dir = tmp_path / "run"
    first = start(run_dir, *RUN, "steps=100000")  # still running when the second one starts
    try:
        wait_for_step(first, run_dir, 2)
        r = run_cli(run_dir, *RUN, "seed=7")
        assert r.returncode == 2 and "another run is writing there now" in error_line(r.stderr), r.stderr[-2000:]
        assert first.poll() is None, "the first run is still training"
    finally:  # the first run and its workers (one process group) end here, whatever the outcome
        os.killpg(first.pid, signal.SIGTERM)
        first.communicate(timeout=120)
    summary, rows = read_summary(run_dir), (run_dir / "metrics.jsonl").read_bytes()
    steps = [row["step"] for row in read_rows(run_dir)]
    assert steps == list(range(1, len(steps) + 1)), steps  # one run's rows, every step once
    r = run_cli(run_dir, *RUN, "seed=7")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"{run_dir} already holds a run (metrics.jsonl" in error_line(r.stderr), r.stderr
    assert "continue it with resume=auto, or pick another hydra.run.dir" in error_line(r.stderr)
    assert read_summary(run_dir) == summary and (run_dir / "metrics.jsonl").read_bytes() == rows


# --- Ctrl-C and SIGTERM --------------------------------------------------------------------------------------

def stopped(proc, sig, to_group=True, timeout=60):
    """Send `sig` to the run (its whole process group, as a terminal's Ctrl-C does, or the launcher alone);
    returns (stderr, seconds to exit), after checking that no process of the run is left."""
    tree = descendants(proc.pid)
    sent = time.monotonic()
    (os.killpg if to_group else os.kill)(proc.pid, sig)
    _, err = proc.communicate(timeout=timeout)
    took = time.monotonic() - sent
    deadline = time.monotonic() + 10
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in tree if alive(p)], "processes left behind"
    return err, took


@pytest.mark.parametrize("moment", ["importing", "starting workers"])
def test_ctrl_c_during_start_up_is_one_line_and_exit_130(tmp_path, moment):
    """While Python imports torch (it takes seconds), and once the launcher starts the workers (config.yaml is
    written just before)."""
    proc = start(tmp_path / "run", *RUN, fresh=moment == "importing")  # (a forked run has imported already)
    if moment == "importing":
        time.sleep(1.0)
    else:
        while not (tmp_path / "run" / "config.yaml").exists():
            assert proc.poll() is None
            time.sleep(0.01)
    err, _ = stopped(proc, signal.SIGINT)
    assert proc.returncode == 130, err[-3000:]
    assert error_line(err).startswith("ringexp: error: interrupted"), err[-3000:]


def test_ctrl_c_while_training_stops_cleanly_keeping_everything(tmp_path):
    """Loader worker processes and W&B's offline run included: one line, exit 130, every row and checkpoint
    kept, and resume=auto continues."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, *RUN, "steps=100000", "data.num_workers=2", "logger=wandb")
    wait_for_step(proc, run_dir, 7)
    err, took = stopped(proc, signal.SIGINT)
    assert proc.returncode == 130, err[-3000:]
    line = error_line(err)
    assert len(err.strip().splitlines()) == 1, err[-3000:]
    newest = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    assert line.endswith(f"resume=auto hydra.run.dir={run_dir} continues from {newest.name}"), line
    assert read_summary(run_dir) == {"status": "interrupted", "error": "interrupted"}
    steps = [row["step"] for row in read_rows(run_dir)]
    assert steps == list(range(1, len(steps) + 1)) and steps[-1] >= 7, steps
    r = run_cli(run_dir, *RUN, "resume=auto")
    assert r.returncode == 0 and read_summary(run_dir)["resumed_from"]["step"] >= 5, r.stderr[-3000:]


@pytest.mark.parametrize("gap_s", [0.05, 0.6])
def test_a_double_ctrl_c_is_one_line_and_exit_130(tmp_path, gap_s):
    """The second Ctrl-C while the workers stop (they are killed: one line saying so) or once they have stopped
    (the launcher is writing its line: ignored). Neither may print a KeyboardInterrupt traceback."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, *RUN, "steps=100000", "data.num_workers=1")
    wait_for_step(proc, run_dir, 3)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(gap_s)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert len(err.strip().splitlines()) == 1 and error_line(err).startswith("ringexp: error: interrupted"), err


def test_sigterm_to_the_launcher_alone_stops_the_workers_without_a_restart(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_dir, *RUN, "steps=100000", "launcher.max_restarts=2")
    wait_for_step(proc, run_dir, 3)
    err, took = stopped(proc, signal.SIGTERM, to_group=False)
    assert proc.returncode == 130 and "interrupted" in error_line(err), err[-3000:]
    assert took < 30, took
    log = (run_dir / "rank1.log").read_text()
    assert log.count(" on cpu: ") == 1 and "stopped on request" in log, log  # one attempt: no restart


def test_a_launcher_killed_with_sigkill_leaves_no_worker_and_a_resumable_run(tmp_path):
    """kill -9 of the Hydra process: its workers get the kernel's parent-death signal, stop, say so in summary.json
    and exit by themselves (torch's wrapper would wait forever for the dead launcher to read their result), and the
    directory's lock went with its holder: resume=auto continues."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, *RUN, "steps=100000", "data.num_workers=1")
    wait_for_step(proc, run_dir, 7)
    tree = descendants(proc.pid) - {proc.pid}
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 60
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in tree if alive(p)]
    for p in left:  # (a failed test must not leave them to the rest of the suite)
        os.kill(p, signal.SIGKILL)
    assert not left, "workers left behind by a killed launcher"
    newest = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    assert read_summary(run_dir) == {"status": "interrupted", "error": f"interrupted: the launcher (pid {proc.pid}) "
                                     f"was killed; resume=auto hydra.run.dir={run_dir} continues from {newest.name}"}
    r = run_cli(run_dir, *RUN, "steps=12", "resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_summary(run_dir)["status"] == "completed"
    assert [row["step"] for row in read_rows(run_dir)] == list(range(1, 13))


@pytest.mark.parametrize("sig,words", [
    ("SIGTERM", "worker rank 1 failed: exit code 143: it stopped on SIGTERM, sent to it alone"),
    ("SIGSTOP", "worker rank 0 failed: rank 0 on vm"),
])
def test_a_worker_sent_a_signal_alone_is_named_with_the_signal(tmp_path, sig, words):
    """SIGTERM: torch's placeholder ("To enable traceback see ...") said nothing. SIGSTOP: rank 0 reported its own
    receive timeout, without the stopped rank, after its timeout and torch's 30 s of grace for the stopped one."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, *RUN, "steps=100000", "parallel.timeout_s=5")
    wait_for_step(proc, run_dir, 6)
    sent = time.monotonic()
    os.kill(worker_pid(run_dir, 1), getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    assert proc.returncode == 1, err[-3000:]
    line = error_line(err)
    words = words.replace("vm", socket.gethostname())
    assert words in line, line
    if sig == "SIGSTOP":
        assert f"rank 1 on {socket.gethostname()} (127.0.0.1) stopped answering (rank 1's pid " in line, line
        # (before: the timeout, then torch's 30 s of grace for the stopped rank's SIGTERM)
        assert "was stopped (SIGSTOP))" in line and took < 30, (took, line)


# --- the disk and the run directory ----------------------------------------------------------------------------

def test_a_full_disk_while_resuming_is_named_and_loses_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(run_dir)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        r = run_cli(run_dir, *CK)
        assert r.returncode == 0, r.stderr[-2000:]
        kept = [*(run_dir / "checkpoints").rglob("*.*"), run_dir / "summary.json", run_dir / "metrics.jsonl"]
        before = {p: p.read_bytes() for p in kept}
        filler = run_dir / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
        r = run_cli(run_dir, *CK, "steps=16", "resume=auto")
        assert r.returncode == 2, r.stderr[-2000:]
        line = error_line(r.stderr)
        assert f"hydra.run.dir={run_dir}: cannot write there (No space left on device)" in line, line
        assert {p: p.read_bytes() for p in before} == before, "something written before was changed"
        filler.unlink()
        r = run_cli(run_dir, *CK, "steps=16", "resume=auto")
        assert r.returncode == 0 and read_summary(run_dir)["resumed_from"]["step"] == 12, r.stderr[-2000:]
    finally:
        subprocess.run(["umount", "-l", str(run_dir)], check=False)


@pytest.mark.parametrize("where,said", [
    (["hydra.run.dir=/proc/ringexp-run"], "hydra.run.dir=/proc/ringexp-run: cannot write there"),
    (["hydra.run.dir=/dev/null/run"], "hydra.run.dir=/dev/null/run: cannot write there (not a directory)"),
    # interpolated: resolved only inside Hydra, which answered with two tracebacks
    (["hydra.run.dir=/proc/ringexp-${now:%Y}"], "hydra.run.dir=/proc/ringexp-20"),
    (["-m", "hydra.sweep.dir=SWEEP", "hydra.sweep.subdir=/proc/ringexp-${hydra.job.num}"],
     "hydra.sweep.subdir=/proc/ringexp-0: cannot write there"),
])
def test_an_unwritable_run_directory_is_one_line(tmp_path, where, said):
    where = [w.replace("SWEEP", str(tmp_path / "sweep")) for w in where]
    r = subprocess.run([sys.executable, "-m", "ringexp.train", *where, "steps=2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert said in error_line(r.stderr)
    assert not (tmp_path / "sweep").exists()


def test_a_run_directory_with_a_newline_is_refused_and_nothing_is_made(tmp_path):
    """Hydra refuses the override itself; ringexp once made the directory before Hydra read it."""
    r = run_cli(tmp_path / "a\nb", "steps=2")
    assert r.returncode != 0 and "Traceback" not in r.stderr.split("Set the environment variable")[0], r.stderr
    assert list(tmp_path.iterdir()) == []


# --- images ----------------------------------------------------------------------------------------------------

def png_header_only(path, width: int, height: int) -> None:
    """A PNG that declares width x height 8-bit RGB pixels: what PIL reads before it decodes anything."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) +
                     chunk(b"IEND", b""))


def image_run(folder, *extra):
    return ["data=image_folder", f"data.root={folder}", "data.batch_size=4", "steps=6", "eval_every=6",
            "throughput_warmup=1", "model.width=8", "logger=none", *extra]


def test_a_decompression_bomb_is_named_or_skipped_and_unreadable_validation_images_count(tmp_path, image_folder):
    train, val, _ = image_folder_splits(compose_config(image_run(image_folder)).data)
    bomb = image_folder / train.dataset.paths[train.indices[0]]
    png_header_only(bomb, 20000, 20000)
    r = run_cli(tmp_path / "stop", *image_run(image_folder))
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{bomb}: cannot read image (DecompressionBombError" in error_line(r.stderr), r.stderr[-2000:]

    (image_folder / val.dataset.paths[val.indices[0]]).write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(100))
    # (loader worker processes too: what they run must pickle)
    r = run_cli(tmp_path / "skip", *image_run(image_folder, "data.skip_bad=true", "data.num_workers=1"))
    assert r.returncode == 0, r.stderr[-2000:]
    s, rows = read_summary(tmp_path / "skip"), read_rows(tmp_path / "skip")
    assert rows[-1]["val/skipped_bad"] == 1 and s["val_samples"] == 1, rows[-1]
    assert s["data_skipped_bad"] == rows[-1]["data/skipped_bad"] + 1 and rows[-1]["data/skipped_bad"] >= 1


def test_16_bit_images_are_scaled_not_clipped(tmp_path):
    deep = (np.arange(256, dtype=np.uint32).reshape(16, 16) * 257).astype(np.uint16)  # 0 .. 65535
    Image.fromarray(deep).save(tmp_path / "deep.png")
    Image.fromarray((deep >> 8).astype(np.uint8)).save(tmp_path / "shallow.png")
    ds = ImageFolderMultiLabel(tmp_path, ["deep.png", "shallow.png"], [[1.0], [0.0]], 16)
    deep_x, shallow_x = ds[0][0], ds[1][0]
    assert torch.equal(deep_x, shallow_x)
    assert len(torch.unique(deep_x)) == 256  # clipping would leave 2 values


def seven():
    return 7


def test_a_job_without_a_run_directory_leaves_nothing_in_the_temporary_directory(tmp_path, monkeypatch):
    """Calibrate and the tests' workers launch with no run directory for the agent's per-attempt folders; they went
    to a mkdtemp that outlived every job (113 of them in /tmp after one suite)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert workers(seven, 2) == {0: 7, 1: 7}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ringexp-")] == []
