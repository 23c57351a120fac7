#!/usr/bin/env bash
# bench/overlap.py on CUDA GPUs (nccl, bf16, GPU-sized shapes): overlap = none vs
# sub_batch(2) with tp over 2 GPUs, and 4 when there are 4. Tensor parallelism needs
# one GPU per rank (nccl refuses two ranks on one device), so fewer than 2 GPUs is a
# clean skip. Prints bench/overlap.py's table; run from anywhere:
#
#     bash bench/gpu_overlap.sh [--steps 8] [--repeats 3]
#
# Note: on CUDA a collective's wait() only orders streams, so exposed_comm_s (host
# time blocked) under-reports there; the step time is the figure to compare.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
if [ "$GPUS" -lt 2 ]; then
    echo "gpu_overlap.sh: $GPUS CUDA GPU(s); tensor parallelism over nccl needs at least 2 - skipped"
    exit 0
fi
RANKS=(2)
if [ "$GPUS" -ge 4 ]; then RANKS+=(4); fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n "$GPUS"
exec "$PY" bench/overlap.py --device h100-80gb --ranks "${RANKS[@]}" "$@"
