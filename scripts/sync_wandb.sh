#!/usr/bin/env bash
# Upload the offline W&B runs of a sweep (or of single runs): scripts/sync_wandb.sh outputs/multirun/<date>/<time>
# Needs `wandb login` once, and a network.
set -euo pipefail
if [ $# -lt 1 ]; then echo "usage: scripts/sync_wandb.sh SWEEP_OR_RUN_DIR..." >&2; exit 2; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck disable=SC1091
[ -z "${VIRTUAL_ENV:-}" ] && [ -f "$here/.venv/bin/activate" ] && source "$here/.venv/bin/activate"
mapfile -t runs < <(find "$@" -type d -name 'offline-run-*' | sort)
if [ ${#runs[@]} -eq 0 ]; then echo "ringexp: error: no offline W&B runs under $*" >&2; exit 2; fi
echo "uploading ${#runs[@]} offline run(s)"
wandb sync "${runs[@]}"
