"""pytest's fixtures and hooks for the suite (the helpers the tests share are modules of tests/helpers/,
imported by name: tests/README.md): every torch in pytest's own process on one thread, the order and grouping
of tests over scripts/test.sh's two workers, and the fixtures `tiny` and `image_folder`."""

from pathlib import Path

import pytest
import torch
from helpers.runs import TINY, make_image_folder

# Tests that run torch in pytest's own process do it on one thread: their figures do not depend on the machine.
torch.set_num_threads(1)


# How scripts/test.sh spreads the suite over its 2 pytest workers (pytest-xdist, -n 2). A unit of work is one test,
# except where tests share something: a file whose fixtures are module- or session-scoped goes whole to one worker
# (split, each worker would build them again), and test_cluster.py and test_slurm.py, which both start and stop
# this machine's one Slurm (and apt-install it), are one unit, run one after the other. Units go out in the order
# of LONGEST_FIRST (the files whose tests take longest on a 2-core machine, as measured for docs/results/README.md's
# "the suite"), so that the last minutes are short tests filling in, not one long file on one worker.
SHARED = {"test_cluster.py": "slurm", "test_slurm.py": "slurm", "test_compare.py": None, "test_completed.py": None,
          "test_resume.py": None, "test_train.py": None, "test_lr_rule.py": None}
LONGEST_FIRST = ["test_cluster.py", "test_slurm.py", "test_resume.py", "test_hostile.py", "test_tune.py",
                 "test_hostile_tune.py", "test_fuzz.py", "test_plan.py", "test_library.py", "test_faults.py",
                 "test_hostile_run.py", "test_bench.py", "test_quality.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: a file's own order is kept)


@pytest.hookimpl(optionalhook=True)  # (pytest -p no:xdist: no such hook)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            name = Path(path).name
            return nodeid if name not in SHARED else SHARED[name] or path

    config.option.loadscopereorder = False  # in collection order: LONGEST_FIRST's
    return Units(config, log)


@pytest.fixture
def tiny():
    return list(TINY)


@pytest.fixture
def image_folder(tmp_path):
    return make_image_folder(tmp_path / "images")
