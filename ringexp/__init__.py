"""ringexp: a Hydra-configured bench for the communication side of data-parallel training.

As a library (docs/library.md):
    ringexp.ddp_comm_hook(algorithm="ring", compression=None, group=None, **options) -> (state, hook)
    ringexp.all_reduce(tensor, algorithm="ring", group=None, **options) -> tensor
    ringexp.settle_buckets(ddp_model, example_input): DDP's final bucket layout before a resumed hook's first step
"""

from ringexp import comm
from ringexp.comm import all_reduce
from ringexp.parallel.ddp import settle_buckets
from ringexp.parallel.hooks import COMPRESSIONS, CommState, ddp_comm_hook

ALGORITHMS = tuple(comm.ALGORITHMS)
__all__ = ["ALGORITHMS", "COMPRESSIONS", "CommState", "all_reduce", "ddp_comm_hook", "settle_buckets"]
