#!/usr/bin/env bash
# The planner on a shape it was never fitted to (docs/results/plan.md, "An unseen shape"): the local cluster at
# NODES x 1 rank with RATE per node link (default 3 x 1 at 50 Mbit/s: no calibration or run before used either),
# calibrated, then every preset below predicted before any of them runs, then each one trained for STEPS steps on
# the story's task and put beside its prediction (ringexp.compare, and the predictions' plan.json). About 20
# minutes on the 2-core machine; needs root (ip, tc).
#   scripts/unseen_check.sh [OUT] [NODES] [RATE] [STEPS]     (default outputs/unseen-check 3 50mbit 80)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh" >/dev/null
cd "$root"
out="${1:-outputs/unseen-check}"
nodes="${2:-3}"
rate="${3:-50mbit}"
steps="${4:-80}"
name="local_${nodes}x1_${rate}"
cluster="$root/scripts/cluster_local.sh"
task=(model.width=48 data.image_size=16 data.batch_size=8 data.motif_contrast=2.0 data.val_size=256 logger=none
      "steps=$steps" "eval_every=$steps")
presets=(ddp ring_fp16 ring_int8 hierarchical hierarchical_int8 ddp_powersgd)
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
"$cluster" down >/dev/null 2>&1 || true
"$cluster" up --nodes "$nodes" --rate "$rate" >/dev/null
rm -rf "$out"
mkdir -p "$out"
"$cluster" torchrun --nproc-per-node 1 -- -m ringexp.plan calibrate "out=conf/cluster/$name.yaml" \
  2> >(grep -E "^ringexp|Error" >&2)
list=$(IFS=,; echo "${presets[*]}")
python -m ringexp.plan predict "cluster=$name" "presets=[$list]" "out=$out/predict" "${task[@]}" \
  > "$out/predict.txt"
for p in "${presets[@]}"; do
  "$cluster" torchrun --nproc-per-node 1 -- -m ringexp.train "+parallel=$p" "${task[@]}" \
    "hydra.run.dir=$out/runs/$p" > "$out/run-$p.log" 2>&1 || { tail -20 "$out/run-$p.log"; exit 1; }
done
python -m ringexp.compare "$out/runs" --out "$out/compare" > "$out/compare.txt"
echo "unseen_check: predictions $out/predict.txt, runs $out/compare.txt"
