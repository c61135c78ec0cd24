"""Sweeps on a real Slurm: scripts/slurm_local.sh starts a single-node cluster (installing slurm-wlm and
munge where needed), and a multirun goes through hydra/launcher=slurm: 2 configurations x 2 tasks each,
plus one job that fails, whose error lands in its run directory and in the sweep's compare report."""

import os
import subprocess
import sys

import pytest
from helpers.processes import ROOT
from helpers.runs import TINY

from ringexp.records import read_rows, read_summary

pytestmark = pytest.mark.slow  # real runs of the CLI (the fast tier is -m 'not slow')


@pytest.fixture(scope="module")
def slurm():
    up = subprocess.run([str(ROOT / "scripts/slurm_local.sh"), "up"], capture_output=True, text=True, timeout=300)
    if up.returncode == 3:  # the script's code for "packages missing and cannot be installed"
        pytest.skip(f"no local Slurm: {up.stderr.strip()}")
    assert up.returncode == 0, up.stdout + up.stderr
    # SLURM_CONF as `slurm_local.sh env` exports it, read back from a shell that evals its lines
    conf = subprocess.run(["bash", "-c", 'eval "$("$0" env)" && printf %s "$SLURM_CONF"',
                           str(ROOT / "scripts/slurm_local.sh")], capture_output=True, text=True, timeout=60,
                          check=True)
    yield {**os.environ, "SLURM_CONF": conf.stdout}
    subprocess.run([str(ROOT / "scripts/slurm_local.sh"), "down"], capture_output=True, timeout=60)


def test_a_sweep_runs_on_slurm_with_one_rank_per_task(tmp_path, slurm):
    sweep = tmp_path / "sweep"
    # int8 for all three: the fsdp job is given a compressor FSDP cannot take, and fails inside its Slurm job
    cmd = [sys.executable, "-m", "ringexp.train", "-m", *TINY, "logger=none", "+parallel=ddp,ring,fsdp",
           "compression=int8", "backend=gloo_loopback", "hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2",
           f"hydra.sweep.dir={sweep}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=slurm)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (sweep / ".submitit").is_dir()  # really went through submitit
    summaries = [read_summary(sweep / str(i)) for i in range(3)]
    for i, s in enumerate(summaries[:2]):
        assert s["status"] == "completed" and s["world_size"] == 2, s
        assert s["strategy"] == ["ddp", "ring"][i] and s["compression"]["name"] == "int8"
        # the backend group's variable, read back from both Slurm tasks
        assert s["backend_env"]["env"]["GLOO_SOCKET_IFNAME"] == "lo" and s["backend_env"]["ranks"] == 2, s
        # both Slurm tasks were ranks of one job: each wrote its log, rank 0 the records
        assert (sweep / str(i) / "rank0.log").exists() and (sweep / str(i) / "rank1.log").exists()
        rows = read_rows(sweep / str(i))
        assert rows[-1]["step"] == 12 and rows[-1]["val/auroc_macro"] > 0
    assert summaries[2]["status"] == "failed" and "compression=int8 with +parallel=fsdp" in summaries[2]["error"]
    md = (sweep / "compare.md").read_text()
    assert md.count("| +parallel=") == 2 and "Failed runs:" in md and "+parallel=fsdp" in md.split("Failed runs:")[1]


def test_slurm_local_status_reports_the_cluster(slurm):
    r = subprocess.run([str(ROOT / "scripts/slurm_local.sh"), "status"], capture_output=True, text=True, timeout=60,
                       env=slurm)
    # the node answers (idle, or still allocated while the last sweep's jobs complete)
    assert r.returncode == 0 and "local" in r.stdout, r.stdout + r.stderr
    assert any(state in r.stdout for state in ("idle", "mix", "alloc", "comp")), r.stdout


def test_a_preempted_slurm_job_requeues_and_resumes_from_its_checkpoint(tmp_path, slurm):
    """Slurm's pre-emption / time-limit signal (USR2, what `--signal` sends before the kill): submitit's handler
    requeues the job through hydra-submitit-launcher's `checkpoint`, and the requeued job continues from the
    newest checkpoint in the same run directory (SLURM_RESTART_COUNT makes resume=auto)."""
    import time

    sweep = tmp_path / "sweep"
    run_dir = sweep / "0"
    cmd = [sys.executable, "-m", "ringexp.train", "-m", *[o for o in TINY if not o.startswith("steps")],
           "steps=40", "checkpoint.every_steps=5", "logger=none", "hydra/launcher=slurm",
           "hydra.launcher.tasks_per_node=2", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=slurm)
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / "step-00000005" / "meta.json").is_file() or read_rows(run_dir)[-1]["step"] < 8:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    job = next(p.name for p in (sweep / ".submitit").iterdir() if p.name.isdigit())
    subprocess.run(["scancel", "--signal=USR2", job], check=True, env=slurm)
    # Slurm holds a requeued job for 120 s (its EligibleTime); once it is pending again, make it eligible now.
    while "Reason=BeginTime" not in subprocess.run(["scontrol", "show", "job", job], capture_output=True,
                                                     text=True, env=slurm).stdout:
        assert proc.poll() is None and time.monotonic() < deadline + 120, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, env=slurm)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["resumed_from"]["step"] >= 5, s.get("resumed_from")
    assert [row["step"] for row in read_rows(run_dir)] == list(range(1, 41)), "every step exactly once"
    assert "requeue" in (sweep / ".submitit" / job / f"{job}_0_log.err").read_text().lower()


def test_a_jobs_rendezvous_port_lies_below_the_ephemeral_ports():
    """submitit draws the port from the job id in 20000-60000, where the kernel also hands out the ports of outgoing
    connections: a fresh Slurm's job 1 always got 51342, found in use on a node (EADDRINUSE). ringexp's port is the
    same for every task of a job and below 32768 (the sweeps above rendezvous on it through real Slurm tasks)."""
    from ringexp.launch import job_port
    ports = [job_port(str(j)) for j in range(1, 2001)]
    assert all(20000 <= p < 32768 for p in ports) and job_port("1") != 51342
    assert ports == [job_port(str(j)) for j in range(1, 2001)] and len(set(ports)) > 1800
