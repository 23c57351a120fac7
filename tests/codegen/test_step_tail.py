"""A pipelined step's head and tail in train.py (issue 36): the executor gets a function
that makes a micro-batch (Note [data when needed] in runtime/parallel/pipeline/pipeline.py),
and the loss rides in the clip's all-reduce over pp, the guard's SIGTERM flags too where
pp is every rank (Note [one all-reduce after backward] in runtime/train/faults.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parc.codegen.build import generate
from parc.dsl import load

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.par"
PP_ONLY = ("parallel.dp=1", "parallel.tp=1", "parallel.pp=2", "mesh.devices_per_node=2")
DP_PP = ("parallel.dp=2", "parallel.tp=1", "parallel.pp=2", "mesh.devices_per_node=4")


def train_py(*sets: str) -> str:
    text = generate(load(str(TINY), list(sets)))["train.py"].decode()
    compile(text, "train.py", "exec")
    return text


@pytest.mark.parametrize("sets", [PP_ONLY, DP_PP, (*DP_PP, "parallel.zero=1")], ids=["pp", "dp-pp", "dp-pp-zero1"])
def test_the_executor_makes_each_micro_batch_itself(sets):
    train = train_py(*sets)
    assert "def batch(micro):" in train and "loss_sum = runner.step(batch)" in train
    assert "batches = []" not in train and "batches.append" not in train  # no list made before the step


def test_pp_everywhere_one_all_reduce_carries_norm_loss_and_flags():
    train = train_py(*PP_ONLY)
    assert "summed = guard.summands(loss_sum)" in train and "pp_group=pp_group, summed=summed" in train
    assert "if guard.check(step, loss_sum, grad_norm, signalled=signalled):" in train
    assert "loss_over_pipeline" not in train


def test_dp_pp_the_loss_rides_and_the_flags_go_over_the_world():
    train = train_py(*DP_PP)
    assert "summed=summed" in train and "loss_sum = float(summed[0])" in train
    assert "if guard.check(step, loss_sum, grad_norm):" in train  # its own MAX over every rank
    assert "loss_over_pipeline" not in train and "dp.all_reduce_mean(loss_sum, dp_group)" in train


def test_another_clip_keeps_the_separate_all_reduces():
    train = train_py(*DP_PP, "parallel.zero=1")  # ZeRO's reduce_gradients_and_clip
    assert "summands" not in train and "loss_over_pipeline(loss_sum, pp_group)" in train
    assert "if guard.check(step, loss_sum, grad_norm):" in train
