#!/usr/bin/env bash
# runtime/kernels' Triton kernels on a CUDA GPU: their tests compiled for the GPU (here
# they run in Triton's interpreter), then bench/kernels.py on CUDA in fp32 and bf16
# (eager, torch.compile and parc, with the GPU's copy bandwidth), the MoE ops (permute_rows,
# combine_rows, grouped_mm: triton_moe.py) among them. No GPU: a clean skip.
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
    # The repo's own parc/ comes first on sys.path (the current folder, bench/kernels.py's
    # ROOT), so a shim folder elsewhere is never reached: link the source folders into it
    # for this run instead, and take the links away after.
    LINKS=()
    for d in dsl codegen runtime templates; do
        [ -e "parc/$d" ] || { ln -s "../$d" "parc/$d"; LINKS+=("parc/$d"); }
    done
    trap 'rm -f "${LINKS[@]}"' EXIT
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
export PYTHONUNBUFFERED=1
status=0
# --noconftest: test_triton.py needs no fixture, and tests/conftest.py imports the
# compiler (jsonschema, lark), which a GPU machine's python may lack
PARC_TRITON_TESTS_ON_GPU=1 "$PY" -m pytest -q -p no:cacheprovider --noconftest tests/kernels/test_triton.py || status=$?
SHAPES=(--shapes 4096x1024 8192x4096 --ce-shapes 4096x32000 16384x32000 --moe-shapes 8192x1024 32768x4096)
"$PY" bench/kernels.py --device cuda "${SHAPES[@]}" --repeats 20 "$@"
"$PY" bench/kernels.py --device cuda --dtype bf16 "${SHAPES[@]}" --repeats 20 "$@"
exit $status
