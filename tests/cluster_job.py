"""Run by tests/test_cluster.py under torchrun on every node of scripts/cluster_local.sh: every hand-written
collective against torch's builtin all-reduce across the real node boundary, and the hierarchical groups
against the node each rank really runs on. Writes rank<R>.json into the directory given as argv[1]."""

import json
import os
import sys

import torch
import torch.distributed as dist

from ringexp import comm
from ringexp.comm.hierarchical import default_nodes, node_rings
from ringexp.comm.p2p import global_ranks

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
wrong = []
for numel in (1, 3, 1009, 65537, 300_001):
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(numel, generator=torch.Generator().manual_seed(numel + 7 * rank), dtype=dtype)
        exact = x.clone()
        dist.all_reduce(exact)
        for algo, opts in (("ring", {}), ("naive", {}), ("hierarchical", {}), ("hierarchical", {"variant": "leader"})):
            out = comm.all_reduce(x.clone(), algo, **opts)
            if not torch.allclose(out, exact, rtol=1e-5, atol=1e-5):
                wrong.append(f"{algo} {opts} {numel} {dtype}: max error {float((out - exact).abs().max())}")
nodes = default_nodes(global_ranks(None))
node, inter = node_rings(None, nodes)
result = {"rank": rank, "world": world, "node": int(os.environ["RINGEXP_CLUSTER_NODE"]), "nodes": nodes,
          "node_ranks": node, "inter_ranks": inter, "wrong": wrong}
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
