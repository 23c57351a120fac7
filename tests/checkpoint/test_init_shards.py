"""Sharded initialization equals the one-rank initialization, bit for bit.

Note [counter-based init] (runtime/models/param_init.py): each rank generates only the
elements of its own shard. Each layout's generated trainer saves its initial state
(``reshard_worker.py``: the save right after ``restore``, which is step 0 on a fresh
start); the checkpoint holds every parameter whole, so the layouts' initial models
are compared tensor by tensor with the one-rank build's, and that one with
``param_init.full_init``.
"""

from __future__ import annotations

import re

import pytest
import torch

from parc.runtime.checkpoints import checkpoint
from parc.runtime.models.param_init import full_init

from .trainer import LAYOUTS, RESHARD_WORKER, build, run

CASES = [  # (spec, layout, the one-rank layout it must equal)
    ("gpt.par", "tp2", "one"), ("gpt.par", "pp2", "one"), ("gpt.par", "zero3_dp2", "one"),
    ("gpt.par", "cp2_ring", "one"), ("gpt.par", "moe_ep2", "moe_one"), ("gpt.par", "moe_tp2", "moe_one"),
    ("gpt.par", "moe_etp2_dp2_zero1", "moe_one"),
    ("llama.par", "tp2", "one"), ("llama.par", "pp2", "one"), ("llama.par", "zero3_dp2", "one"),
]


@pytest.fixture(scope="module")
def initial(tmp_path_factory):
    """``initial(spec, layout)``: the model tensors the layout's trainer starts from."""
    cache = {}

    def get(spec: str, layout: str) -> dict[str, torch.Tensor]:
        if (spec, layout) not in cache:
            out = tmp_path_factory.mktemp(f"init_{spec[:-4]}_{layout}")
            build_dir = build(layout, out / "build", spec=spec)
            run(build_dir, LAYOUTS[layout][1], [str(build_dir), "--steps", "1", "--checkpoint-dir", str(out / "ck")],
                script=RESHARD_WORKER)
            seed = int(re.search(r"^SEED = (\d+)", (build_dir / "train.py").read_text(), re.M).group(1))
            cache[spec, layout] = seed, checkpoint.read_full(str(out / "ck" / "step_000000"), "model.")
        return cache[spec, layout]

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
        expected = full_init(key[len("model."):], value.shape, layers=layers, seed=seed)
        assert torch.equal(value, expected), key
