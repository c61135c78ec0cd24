#!/usr/bin/env bash
# The all-reduce table on the local cluster (docs/cluster.md), side by side against builtin in one invocation per
# topology: 2 nodes x 2 ranks at 1 Gbit/s and at 250 Mbit/s, and 4 nodes x 1 rank at 1 Gbit/s; 64 MB float32,
# every algorithm, uncompressed and with each wire format / compressor (int8:inter: int8 between nodes only, the
# hierarchical rows). First, each topology's link as a plain TCP stream carries it (scripts/link_speed.py, node 1
# to node 0), and each codec's speed on one core (ringexp.bench codec=true). Needs root (the cluster).
#   scripts/bench_cluster.sh [ITERS] [EXTRA BENCH OVERRIDES...]      (ITERS rounds, median kept; default 5)
# Output: outputs/bench-cluster/<topology>/bench.{csv,json} and the printed tables; leaves the cluster down.
# (Hydra's list values quoted: unquoted, [..] is a glob that a file of a matching name in the working directory
# would replace.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh" >/dev/null
iters="${1:-5}"
[ $# -gt 0 ] && shift
cluster="$root/scripts/cluster_local.sh"
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
python -m ringexp.bench codec=true "sizes=[67108864]" "compressors=[fp16,bf16,int8,topk]" iters=7 logger=none \
  "hydra.run.dir=$root/outputs/bench-cluster/codecs"
for topo in "2 2 1gbit" "2 2 250mbit" "4 1 1gbit"; do
  read -r nodes per rate <<<"$topo"
  "$cluster" up --nodes "$nodes" --rate "$rate"
  "$cluster" run 0 -- python "$root/scripts/link_speed.py" receive 5201 &
  "$cluster" run 1 -- python "$root/scripts/link_speed.py" send 198.18.0.10 5201 "$([ "$rate" = 1gbit ] && echo 128 || echo 32)"
  echo -n "link node 1 -> node 0 at $rate: " && wait
  "$cluster" torchrun --nproc-per-node "$per" -- -m ringexp.bench "sizes=[67108864]" "iters=$iters" warmup=1 \
    min_time_s=0 "compressors=[none,fp16,bf16,int8,int8:inter,topk]" logger=none \
    "hydra.run.dir=$root/outputs/bench-cluster/${nodes}x${per}-$rate" "$@"
done
