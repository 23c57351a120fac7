"""The generated tiny trainer (dp 2 × tp 2) trains under torchrun on 4 CPU ranks.

One real run of the example as shipped, through the surfaces a user has: ``build_to``
(what ``parc build`` does), ``torchrun --nproc-per-node 4`` and ``--metrics-jsonl``.
Numerical parity of layouts is tests/parity's job; this checks the build runs at all,
logs what the interface promises, and learns.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

from parc.codegen.build import build_to

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
KEYS = {"step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu", "peak_mem_bytes", "step_time_s"}
STEPS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_tiny_trains_on_four_ranks(tmp_path):
    out = build_to(ROOT / "examples" / "tiny.par", tmp_path / "tiny")
    metrics = tmp_path / "metrics.jsonl"
    command = [
        str(TORCHRUN),
        "--nproc-per-node",
        "4",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "train.py",
        "--steps",
        str(STEPS),
        "--metrics-jsonl",
        str(metrics),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-6000:]}"

    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        assert KEYS <= record.keys(), KEYS - record.keys()
        for key in ("loss", "grad_norm", "lr", "tokens_per_s", "step_time_s"):
            assert math.isfinite(record[key]) and record[key] >= 0, (key, record)
        assert record["peak_mem_bytes"] > 0
    losses = [r["loss"] for r in records]
    # Untrained over vocab 512: about ln 512 ≈ 6.24; two AdamW steps must lower it.
    assert abs(losses[0] - math.log(512)) < 1.0, losses
    assert losses[-1] < losses[0], losses
    # Rank 0 alone prints: one line per step on stdout.
    assert sum(1 for line in done.stdout.splitlines() if line.strip()) >= STEPS
