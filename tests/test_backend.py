"""The backend config group: every preset composes; its variables are read back from inside the workers (and
gloo really reads them there), the user's own environment is kept unless overridden, and the records, W&B's
config and compare's table show them. The torchrun and Slurm paths are checked in test_train and test_slurm."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.processes import ROOT, run_cli
from helpers.runs import TINY
from helpers.wandb_log import history_and_summary
from omegaconf import OmegaConf

from ringexp import backend
from ringexp.config import CONF_DIR, BackendConfig
from ringexp.errors import ConfigError
from ringexp.records import read_summary
from ringexp.validate import compose_config

PRESETS = sorted(p.stem for p in Path(CONF_DIR, "backend").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_and_passes_the_checks(preset):
    b = compose_config([f"backend={preset}"]).backend
    written = OmegaConf.load(Path(CONF_DIR, "backend", f"{preset}.yaml"))
    assert b.name == preset and b.env == {k: str(v) for k, v in written.env.items()}
    assert (b.env == {}) == (preset == "default")


def test_a_plugin_is_refused_unless_the_config_says_it_trusts_it():
    """A library NCCL loads runs its code in every worker: refused (test_bad_input) unless allowed explicitly."""
    with pytest.raises(ConfigError, match="NCCL_NET_PLUGIN=libx.so: names a library"):
        compose_config(["+backend.env.NCCL_NET_PLUGIN=libx.so"])
    b = compose_config(["+backend.env.NCCL_NET_PLUGIN=libx.so", "backend.allow_plugins=true"]).backend
    assert b.env == {"NCCL_NET_PLUGIN": "libx.so"}


@pytest.fixture
def environ():
    """os.environ as it was before the test (backend.apply sets variables in this very process)."""
    saved = dict(os.environ)
    yield os.environ
    os.environ.clear()
    os.environ.update(saved)


def test_the_user_s_value_is_kept_unless_the_config_sets_it(environ):
    environ.update(NCCL_PROTO="LL", NCCL_SOCKET_NTHREADS="3")
    environ.pop("NCCL_ALGO", None)
    got = backend.apply(BackendConfig("nccl_ring_simple", {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}))
    assert got["env"]["NCCL_ALGO"] == "Ring" and got["from"]["NCCL_ALGO"] == "config"
    assert got["env"]["NCCL_PROTO"] == "Simple" and got["from"]["NCCL_PROTO"] == "config (environment had LL)"
    assert got["env"]["NCCL_SOCKET_NTHREADS"] == "3" and got["from"]["NCCL_SOCKET_NTHREADS"] == "environment"
    assert backend.no_effect(got["env"], "gloo") == sorted(k for k in got["env"] if k.startswith("NCCL_"))


def test_workers_whose_environment_differs_are_named():
    same = {"env": {"NCCL_ALGO": "Ring", "NCCL_DEBUG_FILE": "/tmp/a"},
            "from": {"NCCL_ALGO": "config", "NCCL_DEBUG_FILE": "ringexp"}}
    other = {"env": {"NCCL_ALGO": "Tree", "NCCL_DEBUG_FILE": "/tmp/b"},
             "from": {"NCCL_ALGO": "environment", "NCCL_DEBUG_FILE": "ringexp"}}
    assert "differs" not in backend.agreed([same, same | {"env": {**same["env"], "NCCL_DEBUG_FILE": "/tmp/c"}}])
    assert backend.agreed([same, same, other])["differs"] == {"rank 2": {"NCCL_ALGO": "Tree"}}


def test_nccl_s_choices_are_counted_from_its_log(tmp_path):
    """The lines as NCCL's enqueue.cc writes them with NCCL_DEBUG_SUBSYS=TUNING, among its other lines."""
    log = tmp_path / "nccl.log"
    log.write_text("host:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n"
                   + "host:1:1 [0] NCCL INFO Best tuning, algorithm, RING, protocol, SIMPLE\n" * 3
                   + "host:1:1 [0] NCCL INFO Best tuning, algorithm, TREE, protocol, LL\n")
    assert backend.nccl_chose(log) == {"RING/SIMPLE": 3, "TREE/LL": 1}
    assert backend.nccl_chose(tmp_path / "none.log") == {}
    assert backend.total([{"RING/SIMPLE": 3, "TREE/LL": 1}, {"TREE/LL": 4}, {}]) == {"TREE/LL": 5, "RING/SIMPLE": 3}


def user_env() -> dict:
    """This environment without NCCL's variables: only the test's own reach the run (pytest's process may hold
    some a test before this one set)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}


@pytest.mark.slow
def test_a_sweep_records_what_every_worker_had_and_compare_shows_it(tmp_path):
    """Local workers: the user's NCCL_PROTO and NCCL_SOCKET_NTHREADS, and a preset that overrides one of them."""
    sweep = tmp_path / "sweep"
    env = {"NCCL_PROTO": "LL", "NCCL_SOCKET_NTHREADS": "3", "WANDB_SILENT": "true"}
    r = subprocess.run([sys.executable, "-m", "ringexp.train", "-m", *TINY, "logger=wandb",
                        "backend=default,nccl_ring_simple", f"hydra.sweep.dir={sweep}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env={**user_env(), **env})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ringexp: warning: backend.env: NCCL_ALGO, NCCL_PROTO: no effect on gloo (a CPU run)" in r.stderr
    plain, ring = (read_summary(sweep / str(i))["backend_env"] for i in range(2))
    for be in (plain, ring):  # both workers reported it, the same
        assert be["ranks"] == 2 and "differs" not in be and be["nccl_chose"] is None, be
        assert be["env"]["NCCL_SOCKET_NTHREADS"] == "3" and be["from"]["NCCL_SOCKET_NTHREADS"] == "environment"
        assert "NCCL_PROTO" in be["no_effect"]  # gloo reads no NCCL variable
    assert plain["preset"] == "default" and plain["env"]["NCCL_PROTO"] == "LL" and "NCCL_ALGO" not in plain["env"]
    assert ring["env"]["NCCL_ALGO"] == "Ring" and ring["from"]["NCCL_ALGO"] == "config"
    assert ring["env"]["NCCL_PROTO"] == "Simple" and ring["from"]["NCCL_PROTO"] == "config (environment had LL)"
    _, _, run = history_and_summary(next((sweep / "1" / "wandb").glob("offline-run-*/run-*.wandb")))
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["backend_env.NCCL_ALGO"] == "Ring" and config["backend_env.NCCL_PROTO"] == "Simple", config
    md = (sweep / "compare.md").read_text()
    assert "| backend env |" in md and "NCCL_ALGO=Ring NCCL_PROTO=Simple" in md, md


@pytest.mark.slow
def test_gloo_reads_the_group_s_variables_inside_the_workers(tmp_path, tiny):
    """An interface no machine has: gloo, starting in the worker, fails on it (nothing outside the worker set it)."""
    r = run_cli(tmp_path / "run", *tiny, "logger=none", "+backend.env.GLOO_SOCKET_IFNAME=ringexp-none0", timeout=120)
    assert r.returncode != 0 and "ringexp-none0" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
