"""``train.eval``: val_loss has one meaning in every layout (Note [one meaning of val_loss]).

The parity GPT with ``eval = every(2, batches = 2)`` runs 4 steps in each layout; the
val_loss of steps 2 and 4 must equal the single-rank build's within 1e-5 relative, as
training losses do (tests/parity). Runs share the session's torchrun launches
(tests/conftest.py's ``trainers``).
"""

from __future__ import annotations

import pytest

from parity.batch import Case
from parity.harness import layout_overrides
from parity.test_parity import assert_close

STEPS = 4
EVAL = ("train.eval=every(2, batches = 2)",)
LAYOUTS = {
    "dp2": dict(dp=2),
    "tp2": dict(tp=2),
    "pp2": dict(pp=2),
    "cp2": dict(cp=2, parallel__cp_kind="ulysses"),
    "cp2-ring": dict(cp=2, parallel__cp_kind="ring"),  # two load-balanced chunks a rank
    "dp2-tp2": dict(dp=2, tp=2),
}


def case(arch: str, layout: str | None) -> Case:
    degrees = LAYOUTS[layout] if layout else {}
    nproc = degrees.get("dp", 1) * degrees.get("tp", 1) * degrees.get("pp", 1) * degrees.get("cp", 1)
    overrides = tuple(layout_overrides(**degrees)) + EVAL
    return Case(f"{arch}-eval-{layout or 'single'}", f"{arch}.par", overrides, nproc, ("--steps", str(STEPS)))


def cases_of(item) -> list[Case]:
    if item.originalname == "test_val_loss_matches_single_rank":
        return [case(item.callspec.params["arch"], item.callspec.params["layout"]), case(item.callspec.params["arch"], None)]
    return []


@pytest.mark.parametrize("arch", ("gpt", "llama"))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_val_loss_matches_single_rank(arch, layout, trainers):
    runs = trainers.records(case(arch, layout))
    expected = trainers.records(case(arch, None))
    evaluated = [r["step"] for r in expected if r.get("val_loss") is not None]
    assert evaluated == [2, 4]
    assert [r["step"] for r in runs if r.get("val_loss") is not None] == evaluated
    for got, want in zip(runs, expected):
        if want.get("val_loss") is not None:
            assert_close(got["val_loss"], want["val_loss"], f"{arch} {layout} step {got['step']} val_loss")
            assert got["val_loss"] != got["loss"]  # another stream than training's
