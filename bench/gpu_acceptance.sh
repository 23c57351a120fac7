#!/usr/bin/env bash
# The GPU acceptance run (bench/gpu_acceptance.py): the Triton kernel tests, parc's bf16
# trainer of a ~1B Llama (16 layers x 2048 hidden, seq 2048) on one GPU - tokens/s, MFU,
# peak memory - against the planner's prediction (device = h200) and against the same
# model in plain PyTorch (SDPA + torch.compile), one table with a verdict per figure.
# About 5 minutes on one H200; no network. Runs from anywhere, with the repo's .venv or
# the machine's python3 (parc need not be installed: the source folders are linked into
# parc/ for the run, as bench/gpu_kernels.sh does).
#
#     bash bench/gpu_acceptance.sh [--dry-run] [--work DIR] [--json]
#
# --dry-run: the same steps on the CPU at a tiny size (no Triton tests, no torch.compile),
# so CI keeps the script working (tests/observe/test_gpu_acceptance.py); its figures mean nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if ! "$PY" -c 'import parc.runtime, parc.codegen' 2>/dev/null; then
    LINKS=()
    for d in dsl codegen runtime templates; do
        [ -e "parc/$d" ] || { ln -s "../$d" "parc/$d"; LINKS+=("parc/$d"); }
    done
    trap 'rm -f "${LINKS[@]}"' EXIT
fi
# the trainer and the baseline run as scripts: they find parc through the repository root
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [[ " $* " != *" --dry-run "* ]]; then
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
fi
"$PY" bench/gpu_acceptance.py "$@"
