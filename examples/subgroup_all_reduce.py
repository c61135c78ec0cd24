"""Recipe: ringexp's collectives on your own tensors and your own process group.

    torchrun --standalone --nproc-per-node 3 examples/subgroup_all_reduce.py

ringexp.all_reduce(tensor, algorithm, group=..., **options) sums in place, like torch.distributed.all_reduce,
over any group: here ranks 0 and 2 (rank 1 is outside, and its tensor is left as it is, as torch's would be).
Any tensor works: strided views, leaves that require grad, integers (summed exactly), low precision (summed in
float32). A mistake on any rank (different sizes, a bool tensor) raises the same ValueError on every rank, before
anything is sent, and the group stays usable.
"""

import torch
import torch.distributed as dist

import ringexp


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair = dist.new_group([0, 2])  # every rank creates every group, as torch requires

    grads = torch.arange(12.0).view(3, 4) + rank
    ringexp.all_reduce(grads[:, ::2], "ring", group=pair)  # a strided view: its columns are summed in place
    counts = torch.full((2,), 2**40 + rank, dtype=torch.int64)
    ringexp.all_reduce(counts, "hierarchical", group=pair, nodes=2)  # exact: beyond float32's 24 bits
    print(f"rank {rank}: grads {grads.tolist()} counts {counts.tolist()}", flush=True)

    if rank != 1:
        try:  # rank 0 passes 4 elements, rank 2 five: both ranks hear it, nothing was sent
            ringexp.all_reduce(torch.ones(4 + rank // 2), "ring", group=pair)
        except ValueError as e:
            print(f"rank {rank}: {e}", flush=True)
        ones = ringexp.all_reduce(torch.ones(3), "ring", group=pair)  # the group is still usable
        print(f"rank {rank}: still usable: {ones.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
