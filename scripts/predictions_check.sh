#!/usr/bin/env bash
# scripts/predictions_check.sh COMMIT: do the planner's predictions of COMMIT and of this checkout agree?
# Runs `plan predict` on every shipped cluster file x {small_cnn, resnet18} (compute given, so nothing is measured)
# and `plan accuracy` on the shipped published cases, in a worktree of COMMIT and here, and compares every file
# written and every line printed with the two directories' paths put aside. Exit 0: all identical.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
old=${1:?usage: scripts/predictions_check.sh COMMIT}
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/src" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add -q --detach "$tmp/src" "$old"
capture() {  # capture SRC OUT
  local src=$1 out=$2 cl m
  mkdir -p "$out"
  for cl in conf/cluster/*.yaml; do
    cl=$(basename "$cl" .yaml)
    for m in small_cnn resnet18; do
      (cd "$src" && python -m ringexp.plan predict "cluster=$cl" "model=$m" forward_s=0.01 backward_s=0.02 \
        optimizer_s=0.002 "out=$out/$cl-$m" "hydra.run.dir=$out/h-$cl-$m" > "$out/$cl-$m.txt" 2>&1)
    done
  done
  (cd "$src" && python -m ringexp.plan accuracy "cases=[ringexp/plan/published.yaml]" "out=$out/accuracy" \
    > "$out/accuracy.txt" 2>&1)
}
capture "$tmp/src" "$tmp/before"
capture "$ROOT" "$tmp/after"
n=0 bad=0
while IFS= read -r f; do
  n=$((n + 1))
  if ! cmp -s <(sed "s|$tmp/before|OUT|g; s|$tmp/src|SRC|g" "$tmp/before/$f") \
              <(sed "s|$tmp/after|OUT|g; s|$ROOT|SRC|g" "$tmp/after/$f"); then
    echo "differs: $f"; bad=$((bad + 1))
  fi
done < <(cd "$tmp/before" && find . -type f \( -name '*.txt' -o -name '*.json' -o -name '*.md' \) ! -path './h-*' | sort)
echo "$n files compared against $old: $bad differ"
[ "$bad" -eq 0 ]
