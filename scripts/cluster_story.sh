#!/usr/bin/env bash
# The seed articles' tuning story on the local cluster: 2 nodes x 2 ranks, 1 Gbit/s per node link, a Slurm sweep
# of ResNet-18 (11.2M parameters, 45 MB of float32 gradients) at 32 px and 8 images per rank, where plain DDP
# spends most of each step on the link. One job at a time (array_parallelism=1), local records only (logger=none).
#   scripts/cluster_story.sh [STEPS]     (optimizer steps per run, default 200: enough for the model to learn)
# 1. every preset, seed 0; 2. ddp with 4 micro-steps per optimizer step (the same samples: STEPS/4 steps);
# 3. seeds 1 and 2 of ddp and of the fastest preset of 1 (ringexp.compare --fastest parallel); then the compare
# report of 1+2 and, over the 3 seeds of each preset (seed groups: ringexp.compare --groups), the mean throughput
# and macro-AUROC with their spread, the speed-up and the AUROC difference against ddp (the issue's bar: >= 2x and
# within 0.02). Output: outputs/cluster-story/{presets,accumulation,seeds,seed-groups}/ and
# outputs/cluster-story/compare.md (seed-groups/groups.md: the groups' table). Needs root.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh" >/dev/null
steps="${1:-200}"
out="$root/outputs/cluster-story"
cluster="$root/scripts/cluster_local.sh"
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
"$cluster" up --nodes 2 --rate 1gbit --slurm
eval "$("$cluster" env)"  # SLURM_CONF: the cluster's Slurm, for hydra/launcher=slurm
rm -rf "$out"
sweep() {  # sweep NAME OVERRIDES...: one Slurm sweep over both nodes into $out/NAME
  local name="$1"; shift
  python -m ringexp.train -m hydra/launcher=slurm hydra.launcher.nodes=2 hydra.launcher.tasks_per_node=2 \
    hydra.launcher.array_parallelism=1 model=resnet18 data.batch_size=8 logger=none "hydra.sweep.dir=$out/$name" "$@"
}
sweep presets +parallel=ddp,ddp_tuned,hierarchical,hierarchical_int8,ring_fp16,ddp_powersgd,fsdp \
  "steps=$steps" "eval_every=$((steps / 2))"
sweep accumulation +parallel=ddp accumulation=x4 "steps=$((steps / 4))" "eval_every=$((steps / 4))"
python -m ringexp.compare "$out/presets" "$out/accumulation" --out "$out"
best="$(python -m ringexp.compare "$out/presets" --fastest parallel)"  # highest mean throughput, completed runs
echo "cluster_story: fastest preset: $best; seeds 1 and 2 of ddp and $best"
sweep seeds "+parallel=ddp,$best" seed=1,2 "steps=$steps" "eval_every=$((steps / 2))"
# seed 0 of every preset from presets/, seeds 1 and 2 of ddp and $best from seeds/: one group per preset
python -m ringexp.compare "$out/presets" "$out/seeds" --groups --out "$out/seed-groups"
