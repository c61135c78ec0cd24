"""The local cluster (scripts/cluster_local.sh): nodes as network namespaces on a bridge. It comes up and goes
down leaving nothing behind; a job spans its nodes through torchrun's multi-node rendezvous; every hand-written
collective equals builtin across the real node boundary, and the hierarchical groups follow the nodes."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, TINY, read_summary

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc") and shutil.which("nsenter")),
    reason="the local cluster needs root, ip, tc and nsenter")]

SCRIPT = str(ROOT / "scripts" / "cluster_local.sh")


def cluster(*args, timeout=300):
    """The script, with this interpreter's torchrun first on PATH."""
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "WANDB_SILENT": "true"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def leftovers() -> list:
    """What up made that is still there: namespaces, links, name entries, state."""
    found = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
             if n.startswith("ringexp-node")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [w for w in links.replace(":", " ").replace("@", " ").split() if w.startswith(("rxv", "rxbr"))]
    found += [line for line in open("/etc/hosts") if "ringexp-cluster" in line]
    return found + (["/tmp/ringexp-cluster"] if os.path.exists("/tmp/ringexp-cluster") else [])


@pytest.fixture(scope="module")
def two_nodes():
    r = cluster("up", "--nodes", "2", "--rate", "none")
    assert r.returncode == 0, r.stderr
    try:
        yield
    finally:
        r = cluster("down")
        assert r.returncode == 0 and leftovers() == [], (r.stderr, leftovers())


def test_up_twice_is_harmless_and_status_shows_the_nodes(two_nodes):
    r = cluster("up", "--nodes", "2", "--rate", "none")
    assert r.returncode == 0 and "already up" in r.stdout, r.stderr
    r = cluster("status")
    assert r.returncode == 0 and "ringexp-node0  198.18.0.10  unshaped" in r.stdout, r.stdout
    r = cluster("run", "1", "--", "python3", "-c", "import socket; print(socket.gethostbyname('ringexp-node0'))")
    assert r.stdout.strip() == "198.18.0.10", r.stderr
    for bad in (["up", "--nodes", "9"], ["up", "--rate", "fast"], ["run", "7", "--", "true"]):
        r = cluster(*bad)
        assert r.returncode == 2 and r.stderr.startswith("cluster_local: ") and len(r.stderr.splitlines()) == 1


def test_collectives_equal_builtin_across_the_node_boundary(two_nodes, tmp_path):
    r = cluster("torchrun", "--nproc-per-node", "2", "--", str(ROOT / "tests" / "cluster_job.py"), str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(4)]
    for res in results:
        assert res["wrong"] == [] and res["world"] == 4 and res["nodes"] == 2, res
        assert res["node_ranks"] == [2 * res["node"], 2 * res["node"] + 1], res  # the ranks on its own node
        assert res["inter_ranks"] == [res["rank"] % 2, res["rank"] % 2 + 2], res


def test_a_training_job_spans_the_nodes_through_torchrun(two_nodes, tmp_path):
    r = cluster("torchrun", "--nproc-per-node", "2", "--", "-m", "ringexp.train", *TINY,
                "steps=6", "+parallel=hierarchical", "parallel.nodes=4", "logger=none",
                f"hydra.run.dir={tmp_path / 'run'}")  # (4 nodes of the 4-rank job: valid for the job's real world)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(tmp_path / "run")
    assert s["status"] == "completed" and s["world_size"] == 4, s


def test_the_bench_runs_across_the_nodes_and_says_where(two_nodes, tmp_path):
    r = cluster("torchrun", "--nproc-per-node", "2", "--", "-m", "ringexp.bench", "sizes=[4096,262144]", "iters=2",
                "warmup=1", "min_time_s=0", "compressors=[none,fp16]", "logger=none",
                f"hydra.run.dir={tmp_path / 'bench'}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "# nprocs=4 on 2 node(s) x 2 rank(s), link none" in r.stdout, r.stdout[-2000:]
    rows = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert {(row["nprocs"], row["nodes"], row["ranks_per_node"]) for row in rows} == {(4, 2, 2)}
    assert len(rows) == 2 * 10 and all(row["wrong"] == 0 for row in rows), rows  # 5 algorithms x 2 codecs x 2 sizes
