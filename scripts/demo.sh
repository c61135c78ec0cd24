#!/usr/bin/env bash
# Set up .venv if needed, then run the default experiment (2 CPU workers, small CNN, synthetic data).
# Extra arguments are Hydra overrides, e.g. scripts/demo.sh +parallel=ddp_tuned amp=bf16
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec python -m ringexp.train "$@"
