"""Every option of every config group composes against the typed schema and passes validation; the schema holds
every default, and workers get it typed."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ringexp.bench.config import BenchConfig
from ringexp.config import CONF_DIR, StrategyName, TrainConfig, plain
from ringexp.errors import ConfigError
from ringexp.validate import checked as validate
from ringexp.validate import compose_config

GROUPS = ["model", "data", "compression", "accumulation", "amp", "optim", "logger"]


def options(group):
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def composed(overrides):
    """Hydra's composed config (a DictConfig); `validate` makes it the checked TrainConfig."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=overrides)


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes_and_validates(group, option, image_folder):
    root = [f"data.root={image_folder}", "data.batch_size=4"] if option == "image_folder" else []
    cfg = validate(composed([f"{group}={option}", *root]))
    assert getattr(cfg, group) is not None


@pytest.mark.parametrize("preset", options("parallel"))
def test_every_parallel_preset_overlays_the_default(preset):
    preset_yaml = OmegaConf.load(Path(CONF_DIR) / "parallel" / f"{preset}.yaml")
    cfg = composed([f"+parallel={preset}"])
    validate(cfg)
    expected = preset_yaml.get("parallel", preset_yaml)  # _global_ presets nest their block
    for key, value in expected.items():
        if key not in ("defaults", "compression"):
            assert cfg.parallel[key] == value, (preset, key)


@pytest.mark.parametrize("preset,strategy,compressor", [
    ("ring_fp16", "ring", "fp16"), ("ring_int8", "ring", "int8"), ("ddp_fp16", "ddp", "fp16"),
    ("ddp_powersgd", "ddp", "powersgd"), ("ddp_topk", "ddp", "topk"), ("hierarchical_int8", "hierarchical", "int8"),
    ("local_sgd_int8", "local_sgd", "int8"), ("local_sgd_sign", "local_sgd", "sign"),
    ("local_sgd_hierarchical_int8", "local_sgd", "int8")])
def test_compression_presets_set_strategy_and_compressor_and_the_command_line_wins(preset, strategy, compressor):
    cfg = composed([f"+parallel={preset}"])
    assert (cfg.parallel.strategy, cfg.compression.name) == (strategy, compressor)
    assert (cfg.compression.scope == "inter_node") == preset.endswith("hierarchical_int8")
    later = "bf16" if compressor != "bf16" else "fp16"
    assert composed([f"+parallel={preset}", f"compression={later}"]).compression.name == later
    assert composed([f"+parallel={preset}", "compression=none"]).compression.name == "none"


def test_command_line_wins_over_preset():
    cfg = composed(["+parallel=ddp_tuned", "parallel.bucket_cap_mb=7"])
    assert cfg.parallel.bucket_cap_mb == 7 and cfg.parallel.gradient_as_bucket_view is True


def test_accumulation_presets_set_their_step_count():
    assert [composed([f"accumulation={o}"]).accumulation.steps for o in ("none", "x2", "x4", "x8")] == [1, 2, 4, 8]


def test_validation_rejects_what_composition_cannot():
    for overrides, words in [
        (["accumulation.steps=0"], "accumulation.steps"),
        (["data.batch_size=0"], "batch_size"),
        (["launcher.nproc_per_node=0"], "nproc_per_node"),
        (["model.name=resnet_does_not_exist"], "timm"),
        (["+parallel=single", "launcher.nproc_per_node=2"], "single"),
        (["data.train_size=100"], "cannot fill one batch"),
        (["launcher.device=cpu", "launcher.nproc_per_node=null", "+parallel.bucket=1"], "unknown key parallel.bucket"),
    ]:
        with pytest.raises(ConfigError, match=words):
            validate(composed(overrides))


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_sweep_composes_job_by_job(experiment):
    """Expand the experiment's sweep as Hydra's basic sweeper does and compose + validate every job."""
    import itertools

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        base = compose("train", overrides=[f"+experiment={experiment}"], return_hydra_config=True)
        params = {k: str(v).split(",") for k, v in base.hydra.sweeper.params.items()}
        assert params and base.name == experiment
        jobs, refused = 0, []
        for values in itertools.product(*params.values()):
            overrides = [f"+experiment={experiment}", *(f"{k}={v}" for k, v in zip(params, values, strict=True))]
            cfg = compose("train", overrides=overrides)
            try:
                validate(cfg)
                jobs += 1
            except ConfigError as e:
                refused.append((overrides, str(e)))
    # the one combination ringexp refuses on purpose: PyTorch's PowerSGD hook runs on DDP's builtin path only
    assert all("powersgd" in str(o) and "+parallel=ring" in o for o, _ in refused), refused
    assert jobs == {"bucket_sweep": 6, "strategy_matrix": 24, "compression_matrix": 15, "backend_matrix": 4,
                    "backend_gloo": 3}[experiment]


IDENTITY = {"model": "name", "data": "name", "compression": "name", "accumulation": "steps", "amp": "mode",
            "optim": "name", "logger": "mode", "parallel": "strategy", "backend": "name"}


@pytest.mark.parametrize("name,schema", [("train", TrainConfig), ("bench", BenchConfig)])
def test_the_default_config_is_the_schemas_defaults(name, schema):
    """One source of defaults: train.yaml, bench.yaml and their default options add nothing to the dataclasses'
    values."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = OmegaConf.to_object(compose(name))
    assert cfg == schema()


@pytest.mark.parametrize("group", list(IDENTITY))
def test_option_files_restate_no_default(group):
    """An option file names its choice and sets only what differs from the schema's defaults (so a default is
    changed in one place)."""
    defaults = plain(TrainConfig())
    for path in sorted((Path(CONF_DIR) / group).glob("*.yaml")):
        node = OmegaConf.to_container(OmegaConf.load(path))
        node = node.get(group, node) if "# @package _global_" in path.read_text() else node
        restated = [k for k, v in node.items() if k not in ("defaults", IDENTITY[group]) and
                    not isinstance(v, dict) and defaults[group].get(k) == v]
        assert not restated, (path.name, restated)


def test_workers_get_the_typed_config():
    cfg = compose_config(["+parallel=ring_fp16", "launcher.nproc_per_node=2"])
    assert isinstance(cfg, TrainConfig) and cfg.parallel.strategy is StrategyName.ring
    assert cfg.compression.name == "fp16" and cfg.launcher.device in ("cpu", "cuda")
    with pytest.raises(AttributeError):
        cfg.parallel.no_such_key  # noqa: B018  (a dataclass, not a dict: a misspelt key is an error in code too)


def test_a_range_is_checked_even_when_its_group_is_off():
    with pytest.raises(ConfigError, match="compression.ratio=0"):
        validate(composed(["compression=none", "compression.ratio=0"]))
    with pytest.raises(ConfigError, match="data.val_fraction=2"):
        validate(composed(["data.val_fraction=2"]))


@pytest.mark.parametrize("preset", ["hierarchical", "hierarchical_int8"])
def test_hierarchical_presets_take_the_real_nodes_and_emulate_two_on_one(monkeypatch, preset):
    """The presets once forced parallel.nodes=2: on 3 nodes x 1 rank (scripts/cluster_local.sh torchrun) they were
    refused ("parallel.nodes=2 does not divide the 3 workers")."""
    assert compose_config([f"+parallel={preset}"]).parallel.nodes == 2  # one machine: 2 emulated nodes
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert compose_config([f"+parallel={preset}"]).parallel.nodes is None  # the 3 real ones
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("SLURM_NTASKS", "6")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")
    assert compose_config([f"+parallel={preset}"]).parallel.nodes is None


def test_validation_judges_the_world_the_job_really_has(monkeypatch):
    """Under torchrun or Slurm on several nodes the world is the launcher's, not launcher.nproc_per_node (2)."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert compose_config(["+parallel=hierarchical", "parallel.nodes=4"]).parallel.nodes == 4
    with pytest.raises(ConfigError, match="parallel.nodes=3 does not divide the 4 workers"):
        compose_config(["+parallel=hierarchical", "parallel.nodes=3"])
