#!/usr/bin/env bash
# runtime/kernels' Triton kernels on a CUDA GPU: their tests compiled for the GPU (here
# they run in Triton's interpreter), then bench/kernels.py on CUDA in fp32 and bf16
# (eager, torch.compile and parc, with the GPU's copy bandwidth). No GPU: a clean skip.
# Runs from anywhere, with the repo's .venv or the machine's python3 (parc need not be
# installed: a shim on PYTHONPATH maps parc.* to the source folders):
#
#     bash bench/gpu_kernels.sh [extra bench/kernels.py flags, e.g. --no-compile]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_kernels.sh: no CUDA GPU - skipped"
    exit 0
fi
if ! "$PY" -c 'import parc.runtime.kernels' 2>/dev/null; then
    SHIM=$(mktemp -d)
    mkdir "$SHIM/parc"
    cp parc/__init__.py "$SHIM/parc/"
    for d in dsl codegen runtime templates; do ln -s "$PWD/$d" "$SHIM/parc/$d"; done
    export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
export PYTHONUNBUFFERED=1
status=0
PARC_TRITON_TESTS_ON_GPU=1 "$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_triton.py || status=$?
SHAPES=(--shapes 4096x1024 8192x4096 --ce-shapes 4096x32000 16384x32000)
"$PY" bench/kernels.py --device cuda "${SHAPES[@]}" --repeats 20 "$@"
"$PY" bench/kernels.py --device cuda --dtype bf16 "${SHAPES[@]}" --repeats 20 "$@"
exit $status
