#!/usr/bin/env bash
# How well ringexp.plan's cost model predicts the local cluster (docs/results/plan.md). For each shape, 2 nodes
# x 2 ranks at 1 Gbit/s and at 250 Mbit/s and 4 nodes x 1 rank at 1 Gbit/s: bring the cluster up, calibrate
# (writes conf/cluster/local_<nodes>x<ranks>_<rate>.yaml), bench builtin, ring, hierarchical (two_level),
# hierarchical:leader and naive with none, fp16 and int8 at 4, 16 and 64 MB, and put every bench median beside the
# model's prediction (plan accuracy). Then the training story's runs (scripts/cluster_story.sh) in compare, whose
# predicted columns use the 1 Gbit/s file. About 40 minutes on the 2-core machine; needs root (ip, tc).
#   scripts/plan_check.sh [OUT]    (default outputs/plan-check; a shape whose OUT/<shape>/bench/bench.json exists
#                                   is calibrated again but not benched again: delete it to re-bench)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-outputs/plan-check}"
export PATH="$PWD/.venv/bin:$PATH"
trap 'scripts/cluster_local.sh down >/dev/null 2>&1 || true' EXIT
for shape in "2 2 1gbit" "2 2 250mbit" "4 1 1gbit"; do
  read -r nodes k rate <<<"$shape"
  name="local_${nodes}x${k}_${rate}"
  echo "== $name" >&2
  scripts/cluster_local.sh down >/dev/null 2>&1 || true
  scripts/cluster_local.sh up --nodes "$nodes" --rate "$rate" >/dev/null
  scripts/cluster_local.sh torchrun --nproc-per-node "$k" -- -m ringexp.plan calibrate \
    "out=conf/cluster/$name.yaml" 2> >(grep -E "^ringexp|Error" >&2)
  if [ ! -f "$out/$name/bench/bench.json" ]; then
    scripts/cluster_local.sh torchrun --nproc-per-node "$k" -- -m ringexp.bench "sizes=[4194304,16777216,67108864]" \
      "compressors=[none,fp16,int8]" iters=5 warmup=1 min_time_s=0 logger=none "hydra.run.dir=$out/$name/bench" \
      > "$out-$name-bench.log" 2>&1 || { tail -20 "$out-$name-bench.log"; exit 1; }
  fi
  python -m ringexp.plan accuracy "cluster=$name" "bench=[$out/$name/bench/bench.json]" "out=$out/$name"
done
if [ -d outputs/cluster-story/presets ]; then
  python -m ringexp.compare outputs/cluster-story/presets outputs/cluster-story/accumulation --out "$out/story"
fi
