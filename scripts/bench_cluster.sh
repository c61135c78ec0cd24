#!/usr/bin/env bash
# The all-reduce table on the local cluster (docs/cluster.md), side by side against builtin in one invocation per
# topology: 2 nodes x 2 ranks at 1 Gbit/s and at 250 Mbit/s, and 4 nodes x 1 rank at 1 Gbit/s; 64 MB float32,
# every algorithm, uncompressed and with each wire format / compressor. Needs root (the cluster).
#   scripts/bench_cluster.sh [ITERS] [EXTRA BENCH OVERRIDES...]      (ITERS rounds, median kept; default 5)
# Output: outputs/bench-cluster/<topology>/bench.{csv,json} and the printed tables; leaves the cluster down.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh" >/dev/null
iters="${1:-5}"
[ $# -gt 0 ] && shift
cluster="$root/scripts/cluster_local.sh"
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
for topo in "2 2 1gbit" "2 2 250mbit" "4 1 1gbit"; do
  read -r nodes per rate <<<"$topo"
  "$cluster" up --nodes "$nodes" --rate "$rate"
  "$cluster" torchrun --nproc-per-node "$per" -- -m ringexp.bench sizes=[67108864] "iters=$iters" warmup=1 \
    min_time_s=0 compressors=[none,fp16,bf16,int8,topk] logger=none \
    "hydra.run.dir=$root/outputs/bench-cluster/${nodes}x${per}-$rate" "$@"
done
