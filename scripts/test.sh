#!/usr/bin/env bash
# Sets up everything the tests need on a fresh machine, then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[dev]"
exec .venv/bin/python -m pytest -q "$@"
