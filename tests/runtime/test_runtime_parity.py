"""The runtime alone (no generated code): sharded training equals one rank.

Each layout runs tests/runtime/loop.py under torchrun on CPU gloo for 3 steps;
losses and grad norms must match the 1-rank run within 1e-5 relative.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LOOP = Path(__file__).with_name("loop.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")


def run(arch, dp, tp, sp, tmp_path):
    out = tmp_path / f"{arch}-{dp}-{tp}-{int(sp)}.json"
    command = [str(TORCHRUN), "--standalone", f"--nproc-per-node={dp * tp}", str(LOOP),
               arch, str(dp), str(tp), "1" if sp else "0", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("arch,layouts", [
    ("gpt", [(1, 2, True), (2, 2, False)]),
    ("llama", [(1, 4, True), (2, 1, False)]),
])
def test_sharded_equals_single_rank(arch, layouts, tmp_path):
    reference = run(arch, 1, 1, False, tmp_path)
    for dp, tp, sp in layouts:
        got = run(arch, dp, tp, sp, tmp_path)
        for step, ((loss, norm), (want_loss, want_norm)) in enumerate(zip(got, reference), 1):
            assert loss == pytest.approx(want_loss, rel=1e-5), f"dp{dp} tp{tp} sp{sp} step {step} loss"
            assert norm == pytest.approx(want_norm, rel=1e-5), f"dp{dp} tp{tp} sp{sp} step {step} grad_norm"
