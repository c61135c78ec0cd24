"""ringexp: a Hydra-configured bench for the communication side of data-parallel training.

As a library (docs/library.md):
    ringexp.ddp_comm_hook(algorithm="ring", compression=None, group=None, **options) -> (state, hook)
    ringexp.all_reduce(tensor, algorithm="ring", group=None, *, compression=None, **options) -> tensor
    ringexp.settle_buckets(ddp_model, example_input): DDP's final bucket layout before a resumed hook's first step
    ringexp.Averager(model, period, ...): local SGD / DiLoCo in your own loop (averager.step(step) after each step)

The names are loaded on first use: `python -m ringexp.train` starts with this file, and must be able to answer
Ctrl-C with one line before torch has loaded (ringexp.stop).
"""

import importlib

_HOME = {"Averager": "ringexp.parallel.averager", "all_reduce": "ringexp.parallel.hooks",
         "settle_buckets": "ringexp.parallel.ddp",
         "COMPRESSIONS": "ringexp.parallel.hooks", "CommState": "ringexp.parallel.hooks",
         "ddp_comm_hook": "ringexp.parallel.hooks"}
__all__ = ["ALGORITHMS", "Averager", "COMPRESSIONS", "CommState", "all_reduce", "ddp_comm_hook", "settle_buckets"]


def __getattr__(name: str):
    if name == "ALGORITHMS":
        return tuple(importlib.import_module("ringexp.comm").ALGORITHMS)
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'ringexp' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
