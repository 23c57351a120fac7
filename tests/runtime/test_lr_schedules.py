"""The learning-rate schedules of ``optim.lr_at``: warmup-stable-decay's stable part, its
decay's three shapes, and resuming mid-decay (the LR is a function of the step alone)."""

from __future__ import annotations

import math

import pytest

from parc.runtime.optimizers import optim

WSD = dict(kind="wsd", peak_lr=1.0, warmup=2, total_steps=12, min_lr_ratio=0.1, decay=4)


def test_wsd_warms_up_holds_the_peak_then_decays_over_the_last_steps():
    lrs = [optim.lr_at(step, **WSD) for step in range(1, 15)]
    assert lrs[:2] == [0.5, 1.0]  # warmup: peak·s/warmup
    assert lrs[2:8] == [1.0] * 6  # stable: steps 3..8 (12 - 4 = the last stable step)
    assert lrs[8:12] == pytest.approx([0.775, 0.55, 0.325, 0.1])  # linear over steps 9..12
    assert lrs[12:] == pytest.approx([0.1, 0.1])  # --steps past STEPS: the minimum


@pytest.mark.parametrize(
    "shape, at",
    [
        ("linear", lambda p: 1.0 - 0.9 * p),
        ("cosine", lambda p: 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * p))),
        ("sqrt", lambda p: 1.0 - 0.9 * math.sqrt(p)),
    ],
)
def test_each_decay_shape_runs_from_the_peak_to_the_floor(shape, at):
    kw = dict(WSD, shape=shape)
    assert optim.lr_at(8, **kw) == 1.0
    for step, progress in zip(range(9, 13), (0.25, 0.5, 0.75, 1.0)):
        assert optim.lr_at(step, **kw) == pytest.approx(at(progress), abs=1e-12)
    assert optim.lr_at(12, **kw) == pytest.approx(0.1)


def test_the_decay_shapes_differ_early_in_the_decay():
    early = {shape: optim.lr_at(9, **dict(WSD, shape=shape)) for shape in optim.DECAY_SHAPES}
    assert early["sqrt"] < early["linear"] < early["cosine"]  # 1 − √p falls fastest at first


def test_wsd_without_warmup_and_with_decay_over_the_whole_run():
    kw = dict(WSD, warmup=0, decay=12)  # warmup + decay = steps: linear from step 1
    assert optim.lr_at(1, **kw) == pytest.approx(1.0 - 0.9 / 12)
    assert optim.lr_at(12, **kw) == pytest.approx(0.1)


def test_a_run_resumed_mid_decay_gets_the_lrs_of_the_whole_run():
    """The trainer's loop asks ``lr_at(step)`` for ``step in range(done + 1, ...)`` after a
    resume: a fresh process (no state kept) gives the uninterrupted run's LRs exactly."""
    for shape in optim.DECAY_SHAPES:
        kw = dict(WSD, shape=shape)
        whole = [optim.lr_at(step, **kw) for step in range(1, 13)]
        done = 10  # checkpointed mid-decay
        resumed = [optim.lr_at(step, **kw) for step in range(done + 1, 13)]
        assert resumed == whole[done:]  # bit for bit, not approximately


def test_an_unknown_shape_is_refused():
    with pytest.raises(ValueError, match="unknown wsd decay shape 'exp'"):
        optim.lr_at(10, **dict(WSD, shape="exp"))
