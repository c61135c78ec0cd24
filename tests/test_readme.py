"""The README's commands stay true: every `python -m ringexp.train` line in it composes and passes every check
that runs before workers start (the whole run of each is part of the release check, not of the suite)."""

import re
import shlex

import pytest
from helpers.processes import ROOT
from helpers.runs import make_image_folder
from hydra import compose, initialize_config_dir

from ringexp.config import CONF_DIR
from ringexp.entry import check_argv
from ringexp.plan.cli import load
from ringexp.predict import preset_config
from ringexp.train import prepare


def readme_commands() -> list:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("python -m ringexp.train")]


def first_job(args: list) -> list:
    """The overrides of a sweep's first job (`-m key=a,b` -> `key=a`), or the overrides as they are."""
    return [a.split("=", 1)[0] + "=" + a.split("=", 1)[1].split(",")[0] if "=" in a else a for a in args if a != "-m"]


def test_the_readme_shows_training_commands():
    assert len(readme_commands()) >= 5 and len(plan_commands()) >= 2


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_composes_and_validates(command, tmp_path):
    args = shlex.split(command)[3:]
    if any("/path/to/images" in a for a in args):  # enough images for a batch of 32 on each of 2 workers
        folder = make_image_folder(tmp_path / "images", n=80)
        args = [a.replace("/path/to/images", str(folder)) for a in args]
    check_argv(args)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=first_job(args))
    prepare(cfg, tmp_path)


def plan_commands() -> list:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    joined = [b.replace("\\\n", " ") for b in blocks]
    lines = [line.split("#")[0].strip() for block in joined for line in block.splitlines()]
    return [line for line in lines if line.startswith("python -m ringexp.plan predict")]


@pytest.mark.parametrize("command", plan_commands())
def test_every_readme_plan_command_loads_its_cluster_and_training_config(command):
    pc, train = load(shlex.split(command)[4:])
    assert pc.cluster.name and preset_config("ddp", [a for a in train if "parallel=" not in a]).model.name


def test_the_readme_is_a_front_page_that_makes_no_claim_about_the_suite_that_could_go_stale():
    """Under 10,000 bytes (tables live in docs/results/), and no count of tests or minutes of the suite: those change
    with every capability and are measured in docs/results/README.md with their commit."""
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) < 10_000
    claims = re.findall(r"\b\d+ (?:tests|test cases)\b|suite[^.]{0,80}?\b\d+(?:\.\d+)? ?(?:min|minutes)\b", text)
    assert not claims, claims
