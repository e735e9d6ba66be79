#!/usr/bin/env bash
# Create (if missing) the Python venv used by scripts/interop_check.py and install
# scripts/requirements.txt into it. Idempotent: pip runs only when the requirements changed
# (a stamp file in the venv records their hash). The last line printed is the venv's python.
#
#   bash scripts/python_env.sh            # -> /path/to/repo/.venv/bin/python
#   PYTHON=python3.11 bash scripts/python_env.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VOXCACHE_VENV:-$ROOT/.venv}"
REQ="$ROOT/scripts/requirements.txt"
PY="${PYTHON:-python3}"
STAMP="$VENV/.requirements.sha256"

if [ ! -x "$VENV/bin/python" ]; then
    echo "python_env: creating $VENV with $("$PY" --version 2>&1)" >&2
    "$PY" -m venv "$VENV"
fi

want="$( (sha256sum "$REQ"; "$VENV/bin/python" --version 2>&1) | sha256sum | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" != "$have" ]; then
    echo "python_env: installing $REQ" >&2
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$REQ" >&2
    echo "$want" > "$STAMP"
else
    echo "python_env: $VENV is up to date" >&2
fi

echo "$VENV/bin/python"
