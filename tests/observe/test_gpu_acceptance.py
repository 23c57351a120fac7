"""bench/gpu_acceptance.sh --dry-run: every step of the GPU acceptance run (build a bf16
Llama trainer with parc, train a few steps, the planner's prediction, the plain PyTorch
baseline, the table) at a tiny size on the CPU, so the script keeps working where no GPU
is. About 40 s on a shared 2-core machine. The figures are not judged (no timing
assertion): the run must finish and print each row. Not under tests/test_*: its ``parc
profile`` measures the compiled CPU kernels, which tests/conftest.py then loads (or
builds) once before the run instead of the profile compiling them inside the timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_builds_trains_predicts_and_prints_the_table(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_acceptance.sh"), "--dry-run", "--work", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHON=sys.executable))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for row in ("triton kernel tests", "tokens/s", "MFU", "peak memory (GiB)"):
        assert any(line.startswith(row) for line in lines), row
    assert "every step ran" in done.stdout
    assert (tmp_path / "build" / "train.py").exists() and (tmp_path / "metrics.jsonl").read_text().strip()
