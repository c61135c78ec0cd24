#!/usr/bin/env bash
# The GPU check: one table of what ringexp does on this machine's GPUs (scripts/gpu_check.py lists the rows),
# in at most 8 minutes, set-up included.
#   scripts/gpu_check.sh [OUT]          (default outputs/gpu-check; the table also goes to OUT/table.md)
# Python: a python3 whose torch sees a GPU (the machine's own CUDA build, the one its driver runs), with what
# ringexp needs besides installed from pyproject.toml's dependencies: from wheels in .whl/ where the machine
# cannot reach a package index, else from the index (torch itself is never replaced). Without a GPU: ringexp's
# own .venv (scripts/setup.sh), and every row that needs a GPU says it was skipped and why.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-outputs/gpu-check}"
start=$(date +%s)
if python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  py=python3
  missing=$(python3 scripts/missing_packages.py)
  if [ -n "$missing" ]; then
    if compgen -G ".whl/*.whl" >/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ringexp-site .whl/*.whl
      export PYTHONPATH="/tmp/ringexp-site${PYTHONPATH:+:$PYTHONPATH}"
    else
      # shellcheck disable=SC2086
      python3 -m pip install -q $missing
    fi
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # ringexp from this checkout, without reinstalling torch
else
  # shellcheck source=scripts/setup.sh
  source scripts/setup.sh
  py="$VENV/bin/python"
  echo "gpu_check: no CUDA GPU visible here; the rows that need one are skipped" >&2
fi
echo "gpu_check: set-up took $(( $(date +%s) - start )) s" >&2
exec timeout $(( 480 - ($(date +%s) - start) )) "$py" scripts/gpu_check.py "$out"
