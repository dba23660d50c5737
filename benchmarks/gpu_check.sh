#!/usr/bin/env bash
# One GPU, under 8 minutes: the vLLM engine, the deepspeed trainer (ZeRO-3, bf16), weight
# sync into vLLM, NCCL bucketed broadcast and 5 training steps of a Qwen2.5-0.5B-shaped
# model with random weights (no download). Prints throughput and sync times, a RESULT line,
# and exits non-zero if any step failed (see benchmarks/gpu_check.py).
#
#   pip install -e '.[vllm-gpu,deepspeed]'    # GPU machine
#   bash benchmarks/gpu_check.sh
#   bash benchmarks/gpu_check.sh --cpu        # the same steps on CPU, small model (extras: vllm, deepspeed)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
for mod in vllm deepspeed transformers; do
  "$PY" -c "import $mod" 2>/dev/null || {
    echo "gpu_check: '$PY' cannot import $mod; install the extras (pip install -e '.[vllm-gpu,deepspeed]')" \
         "or point PYTHON at an environment that has them" >&2
    exit 2
  }
done
"$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda,
  'gpus', torch.cuda.device_count(), *(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout --signal=INT --kill-after=20 470 "$PY" benchmarks/gpu_check.py "$@"
