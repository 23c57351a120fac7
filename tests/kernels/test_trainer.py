"""A generated trainer with ``kernels = compiled`` trains like ``kernels = eager``.

Both archs, one rank, fp32: every step's loss within 1e-5 relative (the parity
suite's tolerance), and the generated train.py names its choice. The trainers
load the kernels from the run's one cache (Note [one compile per run], tests/conftest.py).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "parity"))
from harness import build_and_run, layout_overrides  # noqa: E402

RTOL = 1e-5


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_compiled_kernels_train_like_eager(arch, tmp_path, ops):  # ops: the run's kernels built
    losses = {}
    for mode in ("compiled", "eager"):
        out = tmp_path / mode
        runs = build_and_run(f"{arch}.par", out, nproc=1, overrides=layout_overrides() + [f"train.kernels={mode}"])
        train_py = next(out.rglob("train.py")).read_text()
        assert f'KERNELS = "{mode}"' in train_py and "net = model.use_kernels(net, KERNELS, dist.device)" in train_py
        losses[mode] = [r["loss"] for r in runs]
    assert len(losses["compiled"]) == len(losses["eager"]) == 6
    # Not bit-identical: the compiled kernels really ran (a silent fallback to eager would be).
    assert losses["compiled"] != losses["eager"]
    for step, (got, want) in enumerate(zip(losses["compiled"], losses["eager"]), 1):
        assert math.isfinite(got) and abs(got - want) <= RTOL * abs(want), (arch, step, got, want)
