#!/usr/bin/env bash
# Set up .venv if needed, lint (ruff; lint-imports: the layers of docs/architecture.md), then run the test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not slow" for the fast tier.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
ruff check .
lint-imports --no-cache --no-logo
set +e
# two pytest workers (pytest-xdist): most tests wait on subprocesses; tests/conftest.py says what runs together.
# (Two keep both cores 86% busy: a clean-clone run takes about 15 minutes, docs/results/README.md, "the suite".)
python -m pytest -n 2 "$@"
rc=$?
set -e
# pytest exits 5 when it collected nothing: that is a broken suite, never a pass.
if [ "$rc" -eq 5 ]; then echo "[test] no tests were collected" >&2; exit 1; fi
exit "$rc"
