"""Runs that survive: a worker killed with SIGKILL mid-run takes the job down fast, names itself, leaves no
process behind and keeps the last checkpoint; `resume=auto` then continues with the very losses of a run
that was never interrupted."""

import pytest
from helpers.runs import KILL_CASES, kill_and_resume, reference_losses


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Uninterrupted runs, one per preset, computed once."""
    return reference_losses(lambda: tmp_path_factory.mktemp("ref"))


@pytest.mark.slow
@pytest.mark.parametrize("preset,kill,resume", KILL_CASES)
def test_killed_run_resumes_with_the_same_losses(tmp_path, references, preset, kill, resume):
    kill_and_resume(tmp_path / "run", preset, kill, resume, references)
