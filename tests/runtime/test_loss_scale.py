"""fp16's dynamic loss scaling (runtime/optimizers/loss_scale.py, Note [dynamic loss scaling]).

- The policy: a finite step keeps the scale until ``growth_interval`` of them in a row
  double it; an overflow (non-finite norm) skips the step and halves it.
- A real overflow: fp16 autocast gradients of a loss scaled by 1e30 overflow, the
  norm the clip measures (after dividing by the scale) is inf, and the scaler skips.
- The clip functions divide the gradients by ``grad_scale`` before measuring.
"""

from __future__ import annotations

import math

import pytest
import torch

from parc.runtime.optimizers import optim
from parc.runtime.optimizers.loss_scale import DynamicLossScale


def test_grow_after_interval_and_backoff_on_overflow(capsys):
    scaler = DynamicLossScale(init=1024.0, growth_interval=3)
    for step in (1, 2):
        assert scaler.begin(step) == 1024.0 and scaler.update(step, 1.5)
    assert scaler.update(3, 0.5) and scaler.scale == 2048.0  # three finite steps in a row
    assert scaler.begin(4) == 2048.0
    assert not scaler.update(4, math.inf)
    assert scaler.scale == 1024.0 and scaler.skipped == 1 and scaler.good_steps == 0
    assert scaler.begin(5) == 1024.0 and not scaler.update(5, math.nan) and scaler.scale == 512.0 and scaler.skipped == 2
    assert "step 5: fp16 gradients overflowed at loss scale 1024" in capsys.readouterr().out
    restored = DynamicLossScale()
    restored.load_state_dict(scaler.state_dict())
    assert restored.state_dict() == {"scale": 512.0, "good_steps": 0, "skipped": 2}


def test_forced_overflow_step_uses_a_huge_scale_once(monkeypatch):
    scaler = DynamicLossScale(init=65536.0)
    monkeypatch.setenv("PARC_OVERFLOW_AT_STEP", "2")
    assert scaler.begin(1) == 65536.0
    assert scaler.begin(2) == 1e30
    assert not scaler.update(2, math.inf)
    assert scaler.scale == 32768.0  # backs off from the real scale, not the forced one
    assert scaler.begin(3) == 32768.0


def _fp16_grads(scale: float) -> torch.nn.Linear:
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = layer(x).float().pow(2).mean()
    (loss * scale).backward()
    return layer


def test_real_fp16_overflow_gives_an_infinite_norm_and_is_skipped():
    scaler = DynamicLossScale(init=65536.0)
    layer = _fp16_grads(1e30)
    norm = optim.clip_grad_norm_(layer, 1.0, tp_group=None, grad_scale=1e30)
    assert not math.isfinite(norm)
    assert not scaler.update(1, norm) and scaler.scale == 32768.0


@pytest.mark.parametrize("scale", [1.0, 1024.0, 65536.0])
def test_clip_divides_by_the_scale_first(scale):
    reference = _fp16_grads(1.0)
    want = optim.clip_grad_norm_(reference, 0.0, tp_group=None)
    scaled = _fp16_grads(scale)
    got = optim.clip_grad_norm_(scaled, 0.0, tp_group=None, grad_scale=scale)
    assert got == pytest.approx(want, rel=1e-2)  # fp16 rounds the scaled gradients differently
    for a, b in zip(reference.parameters(), scaled.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-2, atol=1e-6)
