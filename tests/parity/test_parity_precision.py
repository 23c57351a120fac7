"""Layouts under low precision train like one rank built the same way.

bf16 (bf16 parameters with fp32 master weights, runtime/optimizers/master.py) and fp16 (the
same, with dynamic loss scaling, runtime/optimizers/loss_scale.py): each layout's trainer against the single-rank build
of the same precision, every step's loss and the first step's gradient norm within
1e-3 relative. Not 1e-5 as in fp32 (test_parity.py): a tp shard's matmul, a dp
rank's half batch or a pipeline stage's micro-batch rounds its bf16/fp16 products
in another order than one rank does, so the layouts agree to the low precision's
rounding, not exactly. ``grad_reduce = bf16`` rounds the dp sums of the gradients
to bf16 too: the same bound holds.
"""

from __future__ import annotations

import pytest

from .batch import Case
from .harness import layout_overrides
from .test_parity import STEPS, nproc_of

RTOL = 1e-3
LAYOUTS = {
    "dp2": dict(dp=2),
    "tp2": dict(tp=2),
    "dp2-zero1": dict(dp=2, parallel__zero=1),
    "dp2-zero3": dict(dp=2, parallel__zero=3),
    "pp2": dict(pp=2),
    # train.grad_reduce = bf16: the dp buckets summed in bf16 (runtime/parallel/data/dp.py's reduce_dtype)
    "dp2-grad-reduce-bf16": dict(dp=2, train__grad_reduce="bf16"),
    "dp4-grad-reduce-bf16": dict(dp=4, train__grad_reduce="bf16"),
}
PRECISIONS = ("bf16", "fp16")
CASES = [(p, layout) for p in PRECISIONS for layout in LAYOUTS]
"""fp16 at dp4 once overflowed at step 4 where one rank did not: each rank scaled its
loss by the whole scale, its GRAD_ACCUM being 4 times smaller (loss_scale.py, Note [the
scale of one rank's backward]); the dp4 row holds it."""


def layout_case(precision: str, layout: str) -> Case:
    degrees = dict(LAYOUTS[layout], train__precision=precision)
    return Case(f"gpt-{precision}-{layout}", "gpt.par", tuple(layout_overrides(**degrees)), nproc_of(degrees),
                ("--steps", str(STEPS)))


def reference_case(precision: str) -> Case:
    return Case(f"gpt-{precision}-single", "gpt.par", tuple(layout_overrides(train__precision=precision)), 1,
                ("--steps", str(STEPS)))


def cases_of(item) -> list[Case]:
    """The runs a selected test of this module reads (tests/conftest.py's ``trainers``)."""
    if item.originalname == "test_low_precision_layout_matches_single_rank":
        precision = item.callspec.params["precision"]
        return [layout_case(precision, item.callspec.params["layout"]), reference_case(precision)]
    return []


def _close(got: float, want: float, what: str) -> None:
    assert abs(got - want) <= RTOL * abs(want), f"{what}: {got!r} vs single-rank {want!r}"


@pytest.mark.parametrize("precision,layout", CASES)
def test_low_precision_layout_matches_single_rank(precision, layout, trainers):
    runs = trainers.records(layout_case(precision, layout))
    expected = trainers.records(reference_case(precision))
    assert [r["step"] for r in runs] == [r["step"] for r in expected] == list(range(1, STEPS + 1))
    for got, want in zip(runs, expected):
        _close(got["loss"], want["loss"], f"{precision} {layout} step {got['step']} loss")
    _close(runs[0]["grad_norm"], expected[0]["grad_norm"], f"{precision} {layout} step 1 grad_norm")
