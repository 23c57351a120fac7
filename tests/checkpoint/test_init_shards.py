"""Sharded initialization equals the one-rank initialization, bit for bit.

Note [counter-based init] (runtime/models/param_init.py): each rank generates only the
elements of its own shard. Each layout's generated trainer saves its initial state
(``reshard_worker.py``: the save right after ``restore``, which is step 0 on a fresh
start); the checkpoint holds every parameter whole, so the layouts' initial models
are compared tensor by tensor with the one-rank build's, and that one with
``param_init.fill_`` over the whole tensor (tests/runtime/init_reference.py's ``full_init``).
"""

from __future__ import annotations

import re

import pytest
import torch

from parc.runtime.checkpoints import checkpoint_read
from parc.runtime.models.param_init import fill_
from parity.batch import Case

from .trainer import LAYOUTS, RESHARD_WORKER, overrides

CASES = [  # (spec, layout, the one-rank layout it must equal)
    ("gpt.par", "tp2", "one"), ("gpt.par", "pp2", "one"), ("gpt.par", "zero3_dp2", "one"),
    ("gpt.par", "cp2_ring", "one"), ("gpt.par", "moe_ep2", "moe_one"), ("gpt.par", "moe_tp2", "moe_one"),
    ("gpt.par", "moe_etp2_dp2_zero1", "moe_one"),
    ("llama.par", "tp2", "one"), ("llama.par", "pp2", "one"), ("llama.par", "zero3_dp2", "one"),
]


def initial_case(spec: str, layout: str) -> Case:
    """The layout's trainer saving the state it starts from (step 0), in the trainers' launches."""
    return Case(f"init-{spec[:-4]}-{layout}", spec, tuple(overrides(layout)), LAYOUTS[layout][1],
                ("--steps", "1", "--checkpoint-dir", "{build}/ck"), script=str(RESHARD_WORKER))


def cases_of(item) -> list[Case]:
    """The runs a selected test of this module reads (tests/conftest.py's ``trainers``)."""
    params = item.callspec.params
    if item.originalname == "test_sharded_init_equals_one_rank":
        return [initial_case(params["spec"], params["layout"]), initial_case(params["spec"], params["one"])]
    if item.originalname == "test_one_rank_init_is_full_init":
        return [initial_case(params["spec"], "one")]
    return []


@pytest.fixture
def initial(trainers):
    """``initial(spec, layout)``: (the seed, the model tensors the layout's trainer starts from)."""

    def get(spec: str, layout: str) -> tuple[int, dict[str, torch.Tensor]]:
        build_dir = trainers.run(initial_case(spec, layout)).build
        seed = int(re.search(r"^SEED = (\d+)", (build_dir / "train.py").read_text(), re.M).group(1))
        return seed, checkpoint_read.read_full(str(build_dir / "ck" / "step_000000"), "model.")

    return get


@pytest.mark.parametrize("spec, layout, one", CASES)
def test_sharded_init_equals_one_rank(spec, layout, one, initial):
    (_, ours), (_, reference) = initial(spec, layout), initial(spec, one)
    assert sorted(ours) == sorted(reference)
    unequal = [k for k in reference if not torch.equal(ours[k], reference[k])]
    assert not unequal, f"{spec} {layout}: initial tensors differ from one rank's: {unequal[:5]}"


@pytest.mark.parametrize("spec", ["gpt.par", "llama.par"])
def test_one_rank_init_is_full_init(spec, initial):
    seed, tensors = initial(spec, "one")
    layers = 1 + max(int(k.split(".")[2]) for k in tensors if k.startswith("model.layers."))
    for key, value in tensors.items():
        expected = fill_(torch.empty(value.shape), key[len("model."):], value.shape, layers=layers, seed=seed)
        assert torch.equal(value, expected), key
