"""Bad input from a user: one short line, the right exit code, no traceback, no half-written run."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.processes import ON_OPEN, refused, run_cli
from helpers.runs import TINY
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from ringexp import records
from ringexp.config import CONF_DIR
from ringexp.errors import ConfigError
from ringexp.train import prepare

pytestmark = pytest.mark.slow  # real runs of the CLI (the fast tier is -m 'not slow')


def bad_csv(folder, text):
    (folder / "labels.csv").write_text(text)
    return folder


CASES = {
    "unknown timm model": (lambda f: ["model.name=resnet_does_not_exist"], "model.name=resnet_does_not_exist"),
    "accumulation < 1": (lambda f: ["accumulation.steps=0"], "accumulation.steps=0"),
    "batch size < 1": (lambda f: ["data.batch_size=0"], "data.batch_size=0"),
    "no workers": (lambda f: ["launcher.nproc_per_node=0"], "nproc_per_node=0"),
    "key added by +": (lambda f: ["+parallel.bucket_cap=5"], "unknown key parallel.bucket_cap"),
    "nodes do not divide workers": (lambda f: ["+parallel=hierarchical", "parallel.nodes=3"],
                                    "parallel.nodes=3 does not divide the 2 workers"),
    "segment < 1": (lambda f: ["+parallel=ring", "parallel.segment_kb=0"], "parallel.segment_kb=0"),
    "ratio 0": (lambda f: ["+parallel=ddp_topk", "compression.ratio=0"], "compression.ratio=0"),
    "ratio 0 with compression off": (lambda f: ["compression=none", "compression.ratio=0"], "compression.ratio=0"),
    "error feedback inside the ring": (lambda f: ["+parallel=ring_int8", "compression.error_feedback=true"],
                                       "compression.error_feedback=true with int8 on +parallel=ring"),
    "error feedback on a cast": (lambda f: ["+parallel=ddp_fp16", "compression.error_feedback=true"],
                                 "compression.error_feedback=true with fp16 on +parallel=ddp"),
    "ratio > 1": (lambda f: ["+parallel=ddp_topk", "compression.ratio=1.5"], "compression.ratio=1.5"),
    "two phases for a summable payload": (lambda f: ["+parallel=ddp", "compression=randomk",
                                                     "compression.collective=two_phase"], "randomk has no two-phase"),
    "two phases on one rank": (lambda f: ["+parallel=ddp_sign", "compression.collective=two_phase",
                                          "launcher.nproc_per_node=1"], "this job has 1"),
    "two phases with momentum correction": (lambda f: ["+parallel=ddp_topk", "compression.collective=two_phase",
                                                       "compression.momentum_correction=true", "optim=sgd"],
                                            "collective=all_gather or auto"),
    "rank < 1": (lambda f: ["+parallel=ddp_powersgd", "compression.rank=0"], "compression.rank=0"),
    "powersgd on the ring": (lambda f: ["+parallel=ring", "compression=powersgd"], "cannot carry"),
    "inter_node scope without nodes": (lambda f: ["+parallel=ring_int8", "compression.scope=inter_node"],
                                       "compression.scope=inter_node needs hierarchical"),
    "momentum correction with adamw": (lambda f: ["+parallel=ddp_topk", "compression.momentum_correction=true"],
                                       "momentum_correction needs"),
    "compressing one process": (lambda f: ["+parallel=single", "compression=fp16"], "one process sends nothing"),
    "fsdp with top-k": (lambda f: ["+parallel=fsdp", "compression=topk"], "FSDP reduces gradients itself"),
    "fsdp with int8": (lambda f: ["+parallel=fsdp_bf16", "compression=int8"], "compression=int8 with +parallel=fsdp"),
    "fsdp with nodes": (lambda f: ["+parallel=fsdp", "parallel.nodes=2"], "parallel.nodes=2 with +parallel=fsdp"),
    "negative prefetch": (lambda f: ["+parallel=fsdp", "parallel.forward_prefetch=-1"], "forward_prefetch"),
    "no time-to-target level": (lambda f: ["eval.targets=[]"], "eval.targets=[]: give at least one"),
    "levels out of order": (lambda f: ["eval.targets=[0.9,0.8]"], "eval.targets=[0.9, 0.8]: list the levels in"),
    "a level above 1": (lambda f: ["eval.targets=[0.8,1.5]"], "eval.targets=[0.8, 1.5]: every level must be in"),
    "profile past the end": (lambda f: ["steps=10", "profile.enabled=true", "profile.start_step=9"],
                             "runs past the last step"),
    "cuda without GPUs": (lambda f: ["launcher.device=cuda"], "no GPU is visible"),
    "a variable no backend reads": (lambda f: ["+backend.env.LD_PRELOAD=/x.so"],
                                    "backend.env.LD_PRELOAD=/x.so: not a communication backend variable"),
    "a batch no machine holds": (lambda f: ["data.batch_size=" + "1" + "0" * 30, "data.train_size=" + "1" + "0" * 31],
                                 "x 3 x 32 x 32, need"),
    "a model no machine holds": (lambda f: ["model.width=200000"], "M parameters) with its gradients and adamw state"),
    "labels torch cannot count": (lambda f: ["data.num_labels=" + "1" + "0" * 30], "cannot be built"),
    "a plugin NCCL would load": (lambda f: ["+backend.env.NCCL_NET_PLUGIN=/tmp/evil.so"],
                                 "backend.env.NCCL_NET_PLUGIN=/tmp/evil.so: names a library or file the backend loads"),
    "a tuner plugin": (lambda f: ["+backend.env.NCCL_TUNER_PLUGIN=x"], "set backend.allow_plugins=true"),
    "a topology file": (lambda f: ["+backend.env.NCCL_TOPO_FILE=/x.xml"], "NCCL_TOPO_FILE=/x.xml: names a library"),
    "an NCCL_ALGO NCCL refuses": (lambda f: ["backend=nccl_ring_simple", "backend.env.NCCL_ALGO=Rign"],
                                  "backend.env.NCCL_ALGO=Rign: 'Rign' is not one of NCCL's"),
    "an NCCL_PROTO NCCL refuses": (lambda f: ["+backend.env.NCCL_PROTO=LL256"], "'LL256' is not one of NCCL's"),
    "a socket count of 0": (lambda f: ["backend=nccl_sockets", "backend.env.NCCL_NSOCKS_PERTHREAD=0"],
                            "NCCL_NSOCKS_PERTHREAD=0: must be an integer in [1, 64]"),
    "image folder missing": (lambda f: ["data=image_folder", f"data.root={f}/nope"], "image folder not found"),
    "image folder empty": (lambda f: ["data=image_folder", f"data.root={f}"], "holds no images"),
    "csv too short for a batch": (lambda f: ["data=image_folder", f"data.root={f}"],  # 24 images, batch 32
                                  "22 training images (after data.val_fraction=0.1) cannot fill one batch of 32"),
    "csv lacks columns": (
        lambda f: ["data=image_folder", "data.root=" + str(bad_csv(f, "path,cat\nimg0.png,1\n")),
                   "data.label_columns=[cat,dog]"],
        "labels.csv:1: header lacks column(s) dog"),
    "csv bad value": (
        lambda f: ["data=image_folder",
                   "data.root=" + str(bad_csv(f, "path,cat,dog,bird\nimg0.png,1,0,1\nimg1.png,1,2,0\n"))],
        "labels.csv:3: label values must be 0 or 1"),
    "csv duplicate path": (
        lambda f: ["data=image_folder",
                   "data.root=" + str(bad_csv(f, "path,cat,dog,bird\nimg0.png,1,0,1\nimg1.png,0,0,1\n"
                                                 "img0.png,1,1,0\n"))],
        "labels.csv:4: duplicate path img0.png (first on line 2)"),
    "csv path outside the root": (
        lambda f: ["data=image_folder", "data.root=" + str(bad_csv(f, "path,cat,dog,bird\n/etc/passwd,1,0,1\n"))],
        "labels.csv:2: image /etc/passwd lies outside data.root"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ringexp_validation_errors_are_one_short_line(case, tmp_path, image_folder):
    """Every case through what the CLI runs before any worker starts (compose, then train.prepare), in this
    process: the command line's own behaviour is the next test's, on a few of them."""
    if case == "cuda without GPUs" and torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    make, words = CASES[case]
    folder = image_folder if "csv" in case else tmp_path / "empty"
    folder.mkdir(exist_ok=True)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*make(folder), "logger.mode=disabled"])
    with pytest.raises(ConfigError) as e:
        prepare(cfg, tmp_path / "run")
    assert words in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 400, str(e.value)


@pytest.mark.parametrize("case", ["nodes do not divide workers", "cuda without GPUs", "csv bad value",
                                  "a variable no backend reads"])  # (one of each kind of check; all in-process above)
def test_the_cli_prints_a_validation_error_as_one_line_exit_2_and_writes_nothing_else(case, tmp_path, image_folder):
    if case == "cuda without GPUs" and torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    make, words = CASES[case]
    run_dir = tmp_path / "run"
    r = run_cli(run_dir, *make(image_folder), "logger.mode=disabled")
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ringexp: error: "), r.stderr
    assert words in lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    # A refused command changes nothing on disk: the run directory it would have made is not there.
    assert not run_dir.exists() and not run_dir.parent.joinpath("run").exists(), list(tmp_path.rglob("*"))


def test_a_refused_command_takes_away_only_what_it_created(tmp_path):
    """Refused, a command takes away the folders it created for its run (outputs/runs/<date>/<time>): only its own
    files, and only folders left empty. A second run that started meanwhile in a folder this one created (the same
    <date>) keeps its .hydra/, config, log and lock."""
    mine, other = tmp_path / "runs" / "date" / "mine", tmp_path / "runs" / "date" / "other"

    def second_run():  # starts beside this one as this one takes its lock
        (other / ".hydra").mkdir(parents=True)
        for name in (".hydra/config.yaml", "config.yaml", "train.log", records.LOCK):
            (other / name).write_text(name)

    ON_OPEN[str(mine / records.LOCK)] = second_run
    try:
        r = refused(mine, *TINY, "profile.steps=0")
    finally:
        ON_OPEN.clear()
    assert r.returncode == 2 and "profile" in r.stderr
    assert not mine.exists(), list(mine.rglob("*"))
    assert sorted(p.relative_to(other).as_posix() for p in other.rglob("*")) == [
        ".hydra", ".hydra/config.yaml", records.LOCK, "config.yaml", "train.log"]
    refused(tmp_path / "alone" / "run", *TINY, "profile.steps=0")
    assert not (tmp_path / "alone").exists()  # alone, it takes away every folder it made


COMPOSITION = [
    (["+parallel=nope"], "Available options in 'parallel'"),
    (["amp=fp32"], "Available options in 'amp'"),
    (["compression=zip"], "Available options in 'compression'"),
    (["backend=nccl_nosuch"], "Available options in 'backend'"),
    (["parallel.bucket_cap=5"], "parallel.bucket_cap"),
    (["steps=many"], "steps=many"),
    (["amp.mode=fp8"], "fp8"),
    (["parallel.strategy=ringg"], "ringg"),
]


@pytest.mark.parametrize("overrides,words", COMPOSITION)
def test_composition_errors_are_hydras_own(overrides, words):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        with pytest.raises((HydraException, OmegaConfBaseException)) as e:
            compose("train", overrides=overrides)
    assert words in str(e.value), str(e.value)


@pytest.mark.parametrize("overrides,words", [COMPOSITION[0], COMPOSITION[4]])
def test_the_cli_keeps_hydras_short_message_for_composition_errors(overrides, words, tmp_path):
    r = run_cli(tmp_path / "run", *overrides)
    assert r.returncode == 1
    assert words in r.stderr
    # Hydra's message lists a group's options one a line: short is the options and a few lines more
    options = max(len(list(p.glob("*.yaml"))) for p in Path(CONF_DIR).iterdir() if p.is_dir())
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) < options + 10, r.stderr


def test_a_glob_sweep_of_option_files_is_expanded_by_hydra_without_a_traceback(tmp_path):
    """`-m '+experiment=glob(...)'`: the options are the group's, which only Hydra's sweeper lists (a check that
    expanded the sweep itself raised "ConfigLoader is not set"); every job is still checked as it is composed."""
    r = run_cli(tmp_path / "sweep", "-m", "+experiment=glob(backend_gl*)", *TINY, "profile.steps=0",
                f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert "Traceback" not in r.stderr and "Launching 1 jobs" in r.stdout + r.stderr, r.stderr[-2000:]
    assert "profile" in r.stderr  # (the job ran, and was refused: profile.steps must be >= 1)


@pytest.mark.parametrize("program", [["ringexp.tune", "tune.out={out}", "sweeps itself"],
                                     ["ringexp.plan", "predict", "cluster=local_2x1_100mbit", "predicts every preset"]])
@pytest.mark.parametrize("sweep", ["compression=glob(*)", "compression=fp16,bf16"])
def test_a_sweep_among_the_training_overrides_of_the_tune_or_the_planner_is_one_line(tmp_path, program, sweep):
    """Both run once, composing the training overrides in their own Hydra app (which reported Hydra's refusal as a
    failed job: exit 1, "Error executing job"): a sweep is refused before it, in ringexp's one line."""
    args = [program[0], *(a.format(out=tmp_path / "tune") for a in program[1:-1]), sweep]
    r = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120)
    lines = [x for x in r.stderr.splitlines() if x.startswith("ringexp: error:")]
    assert r.returncode == 2 and len(lines) == 1 and program[-1] in lines[0], r.stderr[-2000:]
    assert "Error executing job" not in r.stderr and not (tmp_path / "tune").exists()


def test_under_torchrun_a_validation_error_is_printed_once(tmp_path):
    """Every rank composes the same config: rank 0 says what is wrong, the others only exit (they printed it too)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "ringexp.train",
           "data.batch_size=0", f"hydra.run.dir={tmp_path / 'run'}"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    lines = [x for x in r.stderr.splitlines() if x.startswith("ringexp: error:")]
    assert lines == ["ringexp: error: data.batch_size=0: need at least 1 sample per batch"], r.stderr[-3000:]
    assert r.returncode != 0 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("arrives", ["while composing", "after the refusal"])
def test_a_non_zero_rank_stopped_by_torchrun_s_agent_says_nothing(monkeypatch, capsys, arrives):
    """Whichever rank is faster, the user reads rank 0's one line: a non-zero rank that the agent stops (its SIGTERM
    raises as Ctrl-C here) while it composes, or while it waits after its own refusal, exits without a word (both
    orders were seen on clean-clone runs: 'ringexp: error: interrupted' printed beside, or instead of, the error)."""
    from ringexp import launch, train

    def stopped(*_):
        raise KeyboardInterrupt

    def refused(*_):
        raise ConfigError("data.batch_size=0: need at least 1 sample per batch")

    monkeypatch.setattr(train, "compose_config", stopped if arrives == "while composing" else refused)
    monkeypatch.setattr(launch.time, "sleep", stopped)  # the agent's SIGTERM during refused_elsewhere's wait
    try:
        train.worker_rank_main()
    except KeyboardInterrupt:  # (caught here: one escaping a test would stop the whole session)
        pytest.fail("the agent's SIGTERM escaped: ringexp.train's cli would print 'interrupted'")
    except SystemExit as e:
        assert e.code in (2, 130) and capsys.readouterr().err == ""
    else:
        pytest.fail("a refused or stopped rank went on")
