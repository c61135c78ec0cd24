"""Fuzz the command line: random override combinations, valid and invalid, for every group and key, through
composition and everything that can reject a config before workers start. Each must end valid, or with
Hydra's composition error (printed by Hydra as a short message), or with ringexp's one-line ConfigError;
nothing else may escape (that would be a traceback)."""

import dataclasses
import random
import typing
from enum import Enum
from pathlib import Path

import pytest
from helpers.processes import run_cli
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from ringexp.config import CONF_DIR, TrainConfig
from ringexp.entry import check_argv
from ringexp.errors import ConfigError
from ringexp.train import prepare

N = 200
GROUPS = {group: [p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml")] + ["bogus"]
          for group in ("model", "data", "compression", "accumulation", "amp", "optim", "logger")}
PRESETS = [p.stem for p in (Path(CONF_DIR) / "parallel").glob("*.yaml")] + ["bogus"]
POOLS = {
    int: ["0", "1", "-1", "2", "3", "7", "100000", "abc", "1.5", "null", "[1,2]"],
    float: ["0", "0.5", "1", "-1", "1e30", "nan", "inf", "abc", "null", "2"],
    bool: ["true", "false", "maybe", "1", "null"],
    str: ["x", "null", "''", "resnet_nope", "/nonexistent", "auto", "small_cnn", "42"],
    list: ["[]", "[a,b]", "x", "[cat]"],
}


def leaves(schema, prefix=""):
    """(dotted key, type) for every leaf of the schema."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            yield from leaves(t, f"{prefix}{f.name}.")
        else:
            args = [a for a in typing.get_args(t) if a is not type(None)]
            yield f"{prefix}{f.name}", (args[0] if args and typing.get_origin(t) is typing.Union else t)


KEYS = list(leaves(TrainConfig))


def values(t):
    if isinstance(t, type) and issubclass(t, Enum):
        return [m.value for m in t] + ["bogus", "null"]
    return POOLS.get(typing.get_origin(t) or t, POOLS[str])


def combination(rng: random.Random) -> list:
    out = []
    for _ in range(rng.randint(1, 5)):
        kind = rng.random()
        if kind < 0.15:
            out.append(f"+parallel={rng.choice(PRESETS)}")
        elif kind < 0.35:
            group = rng.choice(list(GROUPS))
            out.append(f"{group}={rng.choice(GROUPS[group])}")
        elif kind < 0.9:
            key, t = rng.choice(KEYS)
            prefix = rng.choice(["", "", "", "", "+", "++", "~"])
            out.append(f"~{key}" if prefix == "~" else f"{prefix}{key}={rng.choice(values(t))}")
        else:
            out.append(rng.choice(["stepz=3", "+nokey=1", "parallel.bucket=1", "model=", "=3", "steps",
                                  "+experiment=bucket_sweep", "resume=/nonexistent", "launcher.device=cuda"]))
    return out


def outcome(overrides, run_dir):
    """'valid', 'hydra: ...' or 'ringexp: ...'; anything else raises."""
    try:
        check_argv(overrides)
    except ConfigError as e:
        return f"ringexp: {e}"
    try:
        cfg = compose("train", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        return f"hydra: {type(e).__name__}"
    try:
        prepare(cfg, run_dir)
    except ConfigError as e:
        message = str(e)
        assert "\n" not in message and len(message) < 400, message
        return f"ringexp: {message}"
    return "valid"


def test_fuzzed_command_lines_end_valid_or_with_a_short_error(tmp_path):
    rng = random.Random(20261129)
    seen = {"valid": 0, "hydra": 0, "ringexp": 0}
    samples = {}
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for _ in range(N):
            overrides = combination(rng)
            try:
                result = outcome(overrides, tmp_path / "run")
            except Exception as e:  # would reach the user as a traceback
                pytest.fail(f"{overrides}: {type(e).__name__}: {e}")
            kind = result.split(":")[0]
            seen[kind] += 1
            samples.setdefault(kind, []).append(overrides)
    # the fuzzer reaches all three outcomes often enough to mean something
    assert all(n >= 20 for n in seen.values()), seen
    # and the real CLI prints them as promised: one of each kind of error, end to end
    for overrides in samples["ringexp"][:1]:  # (test_bad_input runs the CLI on chosen cases of each kind)
        r = run_cli(tmp_path / "cli", *overrides, "logger=none")
        assert r.returncode == 2 and "Traceback" not in r.stderr, (overrides, r.stderr)
        assert len([x for x in r.stderr.splitlines() if x.strip()]) == 1, (overrides, r.stderr)
    for overrides in samples["hydra"][:1]:
        r = run_cli(tmp_path / "cli", *overrides, "logger=none")
        assert r.returncode == 1 and "Traceback" not in r.stderr, (overrides, r.stderr)
