#!/usr/bin/env bash
# Compression as the ranks grow (docs/results/compression-scaling.md): the local cluster with one rank a node and
# RATE per node link (default 100mbit) at 2, 4 and 8 nodes; at each, calibrate (conf/cluster/local_<n>x1_<rate>.yaml),
# bench a 16 MB gradient through builtin uncompressed and sign, int8 and top-k 1% through the two phases and
# through the all-gather, side by side, and put every bench median beside the planner's prediction (plan
# accuracy). About 25 minutes on the 2-core machine; needs root (ip, tc).
#   scripts/scale_check.sh [OUT] [RATE]    (default outputs/scale-check; a shape whose OUT/<shape>/bench/bench.json
#                                           exists is calibrated again but not benched again: delete it to re-bench)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-outputs/scale-check}"
rate="${2:-100mbit}"
export PATH="$PWD/.venv/bin:$PATH"
trap 'scripts/cluster_local.sh down >/dev/null 2>&1 || true' EXIT
compressors="[sign:two_phase,sign:all_gather,int8:two_phase,int8:all_gather,topk:two_phase,topk:all_gather]"
for nodes in 2 4 8; do
  name="local_${nodes}x1_${rate}"
  echo "== $name" >&2
  scripts/cluster_local.sh down >/dev/null 2>&1 || true
  scripts/cluster_local.sh up --nodes "$nodes" --rate "$rate" >/dev/null
  scripts/cluster_local.sh torchrun --nproc-per-node 1 -- -m ringexp.plan calibrate \
    "out=conf/cluster/$name.yaml" 2> >(grep -E "^ringexp|Error" >&2)
  if [ ! -f "$out/$name/bench/bench.json" ]; then
    scripts/cluster_local.sh torchrun --nproc-per-node 1 -- -m ringexp.bench "sizes=[16777216]" algorithms=[builtin] \
      "compressors=$compressors" iters=5 warmup=1 min_time_s=0 logger=none "hydra.run.dir=$out/$name/bench" \
      > "$out-$name-bench.log" 2>&1 || { tail -20 "$out-$name-bench.log"; exit 1; }
  fi
  python -m ringexp.plan accuracy "cluster=$name" "bench=[$out/$name/bench/bench.json]" "out=$out/$name"
done
