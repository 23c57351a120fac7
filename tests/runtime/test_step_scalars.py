"""Note [one all-reduce after backward] (runtime/train/faults.py) on 2 gloo ranks
(step_scalars_worker.py): the loss and the guard's flags summed in the clip's all-reduce
give every rank what the three all-reduces gave, float for float: the gradient norm and
the clipped gradients, the last stage's loss (negative too), the skip when one rank's loss
or gradient is not finite, the stop when one rank alone got SIGTERM. And ``check`` with
the summed flags issues no collective (no process group in this process)."""

from __future__ import annotations

import importlib.util
import json
import math
import signal
from pathlib import Path

import pytest

from parc.runtime.train.faults import StepGuard

HERE = Path(__file__).parent
spec = importlib.util.spec_from_file_location("step_scalars_ranks", HERE / "ranks.py")
ranks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ranks)
CASES = ("finite", "negative loss", "nan loss", "nan gradient", "sigterm on one rank")
EXPECTED = {  # (the step taken, every rank stopping)
    "finite": (True, False), "negative loss": (True, False), "nan loss": (False, False),
    "nan gradient": (False, False), "sigterm on one rank": (True, True),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("step_scalars")
    ranks.launch(HERE / "step_scalars_worker.py", 2, [str(folder)], folder)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("case", CASES)
def test_one_all_reduce_gives_what_three_gave(case, results):
    for rank in results:
        apart, fused = rank[case]["apart"], rank[case]["fused"]
        assert fused == apart
        assert (fused["take"], fused["stopping"]) == EXPECTED[case]
    assert results[0][case]["fused"]["loss"] == results[1][case]["fused"]["loss"]  # the last stage's, everywhere
    if case == "negative loss":
        assert float(results[0][case]["fused"]["loss"]) == -0.75


def test_check_with_summed_flags_needs_no_collective():
    handler = signal.getsignal(signal.SIGTERM)  # the guard installs its own: restored after
    try:
        guard = StepGuard("skip", rank=0, world_size=2, device="cpu")  # no process group: a collective would raise
        assert guard.check(1, 2.0, 1.0, signalled=0.0) and not guard.stopping
        assert guard.check(2, 2.0, 1.0, signalled=1.0) and guard.stopping
        assert not guard.check(3, math.nan, 1.0, signalled=0.0) and guard.skipped == 1
    finally:
        signal.signal(signal.SIGTERM, handler)
