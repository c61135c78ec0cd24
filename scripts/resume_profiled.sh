#!/usr/bin/env bash
# N resumed runs with the profiler on, each a fresh copy of one 6-step run resumed to 9 steps with steps 7-8
# profiled (tests/test_hostile_run.py's case): how many ended other than completed, and how. A race between the
# profiler's stop and gloo's own thread once aborted 1 run in 8 to 1 in 39 (docs/results/profile-race.md).
#   scripts/resume_profiled.sh [N=100] [OUT=outputs/resume-profiled]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/setup.sh
source scripts/setup.sh
n="${1:-100}"
out="${2:-outputs/resume-profiled}"
task=(throughput_warmup=2 data.train_size=1024 data.val_size=101 data.batch_size=16 model.width=8
      optim.warmup_steps=2 logger=none logger.log_every=1 steps=6 eval_every=3 checkpoint.every_steps=3)
rm -rf "$out" && mkdir -p "$out"
python -m ringexp.train "${task[@]}" hydra.run.dir="$out/base" > "$out/base.out" 2>&1
failed=0
for i in $(seq 1 "$n"); do
  run="$out/run-$i"
  cp -r "$out/base" "$run"
  if python -m ringexp.train "${task[@]}" steps=9 resume=auto profile.enabled=true profile.start_step=7 \
      profile.steps=2 hydra.run.dir="$run" > "$run.out" 2>&1; then
    rm -rf "$run" "$run.out"
  else
    failed=$((failed + 1))
    echo "run $i: $(grep -m1 -E 'malloc|tcache|corrupt|ringexp: error' "$run.out" || echo 'failed')"
  fi
  printf '\r%d of %d, %d failed' "$i" "$n" "$failed" >&2
done
echo >&2
echo "$failed of $n resumed profiled runs failed (kept in $out)"
