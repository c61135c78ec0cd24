#!/usr/bin/env bash
# The seed articles' tuning story on the local cluster: 2 nodes x 2 ranks, 1 Gbit/s per node link, a Slurm sweep
# of ResNet-18 (11.2M parameters, 45 MB of float32 gradients) at 32 px and 8 images per rank, where plain DDP
# spends most of each step on the link. One job at a time (array_parallelism=1), local records only (logger=none).
#   scripts/cluster_story.sh [STEPS]     (optimizer steps per run, default 200: enough for the model to learn)
# 1. every preset, seed 0; 2. ddp with 4 micro-steps per optimizer step (the same samples: STEPS/4 steps);
# 3. seeds 1 and 2 of ddp and of the fastest preset of 1; then the compare report of 1+2 and, for ddp against that
# preset, throughput and macro-AUROC over the 3 seeds (the issue's bar: >= 2x and within 0.02).
# Output: outputs/cluster-story/{presets,accumulation,seeds}/ and outputs/cluster-story/compare.md. Needs root.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh" >/dev/null
steps="${1:-200}"
out="$root/outputs/cluster-story"
cluster="$root/scripts/cluster_local.sh"
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
"$cluster" up --nodes 2 --rate 1gbit --slurm
export SLURM_CONF=/tmp/ringexp-cluster/slurm/slurm.conf
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
best="$(python - "$out/presets" <<'EOF'
import json, pathlib, sys
runs = [json.loads(p.read_text()) for p in pathlib.Path(sys.argv[1]).glob("*/summary.json")]
runs = [r for r in runs if r["status"] == "completed"]
print(max(runs, key=lambda r: r["throughput"]["median"])["choices"]["parallel"])
EOF
)"
echo "cluster_story: fastest preset: $best; seeds 1 and 2 of ddp and $best"
sweep seeds "+parallel=ddp,$best" seed=1,2 "steps=$steps" "eval_every=$((steps / 2))"
python - "$out" "$best" <<'EOF'
import json, pathlib, statistics, sys
out, best = pathlib.Path(sys.argv[1]), sys.argv[2]
by = {}
for p in [*out.glob("presets/*/summary.json"), *out.glob("seeds/*/summary.json")]:
    s = json.loads(p.read_text())
    if s["status"] == "completed" and s["choices"]["parallel"] in ("ddp", best):
        by.setdefault(s["choices"]["parallel"], []).append(s)  # seed 0 from presets/, 1 and 2 from seeds/
tp = {k: statistics.mean(s["throughput"]["median"] for s in v) for k, v in by.items()}
au = {k: statistics.mean(s["final"]["auroc_macro"] for s in v) for k, v in by.items()}
print(f"cluster_story: over {len(by['ddp'])} and {len(by[best])} seeds: ddp {tp['ddp']:.1f} samples/s, "
      f"macro-AUROC {au['ddp']:.3f}; {best} {tp[best]:.1f} samples/s ({tp[best] / tp['ddp']:.2f}x), "
      f"macro-AUROC {au[best]:.3f} ({au[best] - au['ddp']:+.3f})")
EOF
