#!/usr/bin/env bash
# Creates .venv on first use and (re)installs ringexp into it when pyproject.toml changed.
# Sourced by demo.sh and test.sh; fast (a hash check) when .venv is already up to date.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
stamp="$VENV/.ringexp-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing torch and ringexp into $VENV (a few minutes the first time; log: $VENV/setup.log)" >&2
  # --no-compile: pip would byte-compile every file of torch's CUDA build (about 40 s of 90 on 2 cores); Python
  # compiles the modules a command imports on first use and caches them.
  pip=("$VENV/bin/pip" install -q --disable-pip-version-check --no-compile)
  # torch first, pinned: these builds are on the local disk; an unpinned torch would download gigabytes.
  if ! { "${pip[@]}" torch==2.14.1 torchvision==0.29.1 && "${pip[@]}" -e "$ROOT[dev,slurm,lightning]"; } \
      > "$VENV/setup.log" 2>&1; then
    tail -n 30 "$VENV/setup.log" >&2
    echo "[setup] failed; see $VENV/setup.log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
# Bytecode cached (pip installed none): with PYTHONDONTWRITEBYTECODE set, every command would compile torch's
# modules again (seconds each), and a test suite starts hundreds of them.
unset PYTHONDONTWRITEBYTECODE
