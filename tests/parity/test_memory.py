"""The trainer's measured memory equals the formulas for its layout (issue 4, DESIGN §8).

Every rank reports ``param_bytes``, ``grad_bytes``, ``optim_bytes`` and
``activation_peak_bytes`` (runtime/train/memory.py). Here the parity GPT is run in layouts
whose bytes are known in closed form: parameters counted from the model's shapes by
hand (not from the runtime), AdamW's two fp32 moments per element (plus torch's
4-byte ``step`` tensor per parameter tensor), and ZeRO's sharding of the state (stage
1) and of the gradients too (stage 2) over dp, padded to a multiple of dp. Saved
activations must fall as recompute goes none → selective → full. The runs share
the parity suite's launches (tests/conftest.py's ``trainers``).
"""

from __future__ import annotations

import math

import pytest

from .batch import Case
from .harness import layout_overrides

# tests/parity/specs/gpt.par: vocab 256 (already a multiple of 128), hidden 64,
# seq_len 32, ffn 128, 2 layers, tied embeddings, biases everywhere (GPT-2).
V, C, T, F, L = 256, 64, 32, 128, 2
EMBED = V * C  # 16384
POS = T * C  # 2048
LAYER = 4 * (C * C + C) + 4 * C + (F * C + F) + (C * F + C)  # q,k,v,o; 2 LayerNorms; MLP
FINAL_NORM = 2 * C
TENSORS_PER_LAYER = 8 + 4 + 4  # q,k,v,o weight+bias; two norms' weight+bias; up/down weight+bias
FP32 = 4


def whole_model() -> tuple[int, int]:
    """(parameters, parameter tensors) of the unsharded model."""
    return EMBED + POS + L * LAYER + FINAL_NORM, 2 + L * TENSORS_PER_LAYER + 2


def memory_case(name: str, nproc: int, **degrees) -> Case:
    """A 2-step run of the parity GPT whose last record's ``memory_per_rank`` a test reads."""
    return Case(f"memory-{name}", "gpt.par", tuple(layout_overrides(**degrees)), nproc, ("--steps", "2"))


ZERO = {zero: memory_case(f"dp2-zero{zero}", 2, dp=2, parallel__zero=zero) for zero in (0, 1, 2)}
PIPELINE = memory_case("pp2", 2, pp=2)
ZERO3 = memory_case("dp4-zero3", 4, dp=4, parallel__zero=3)
# Note [ZeRO over per-layer layouts]: block 0 (and the tied table) tp 2 × dp 1, block 1 tp 1 × dp 2
HETERO_ZERO1 = memory_case("hetero-tp21-zero1", 2, tp=2, parallel__tp="[2, 1]", parallel__dp="[1, 2]",
                           parallel__zero=1)
RECOMPUTE = {mode: memory_case(f"recompute-{mode}", 1, parallel__recompute=mode) for mode in ("none", "selective", "full")}


def cases_of(item) -> list[Case]:
    """The runs a selected test of this module reads (tests/conftest.py's ``trainers``)."""
    if item.originalname == "test_dp2_bytes_equal_the_zero_formulas":
        return [ZERO[item.callspec.params["zero"]]]
    if item.originalname == "test_dp4_zero3_holds_a_quarter_of_every_unit":
        return [ZERO3]
    if item.originalname == "test_pp2_stages_hold_their_layers":
        return [PIPELINE]
    if item.originalname == "test_hetero_zero1_shards_each_layer_over_its_own_dp":
        return [HETERO_ZERO1]
    if item.originalname == "test_saved_activations_fall_with_recompute":
        return list(RECOMPUTE.values())
    return []


def per_rank(trainers, case: Case) -> list[dict]:
    return trainers.records(case)[-1]["memory_per_rank"]


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_dp2_bytes_equal_the_zero_formulas(zero, trainers):
    psi, tensors = whole_model()
    ranks = per_rank(trainers, ZERO[zero])
    shard = math.ceil(psi / 2)  # each dp rank's slice of the flat buffer
    expected_grads = {0: psi, 1: psi, 2: shard}[zero] * FP32
    expected_optim = 2 * psi * FP32 + tensors * FP32 if zero == 0 else 2 * shard * FP32
    for rank, row in enumerate(ranks):
        assert row["param_bytes"] == psi * FP32, f"rank {rank}: {row}"
        assert row["grad_bytes"] == expected_grads, f"rank {rank} zero {zero}: {row}"
        assert row["optim_bytes"] == expected_optim, f"rank {rank} zero {zero}: {row}"


def test_dp4_zero3_holds_a_quarter_of_every_unit(trainers):
    """ZeRO-3 at dp 4 (runtime/parallel/data/fsdp.py, Note [units]): each block and the root (embeddings,
    final norm) is padded to a multiple of 4 and every rank keeps a quarter: resident
    parameter bytes 4·Σ⌈n_unit/4⌉, which is 4·⌈Ψ/4⌉ up to < 4 elements of padding per unit;
    gradient shards and two moments alike. Gathered at once, at most: the root and two
    blocks (the one computing and the one prefetched)."""
    psi, _ = whole_model()
    units = [EMBED + POS + FINAL_NORM] + [LAYER] * L
    padded = [4 * math.ceil(n / 4) for n in units]
    resident = sum(padded) // 4 * FP32
    assert 4 * math.ceil(psi / 4) <= resident < 4 * math.ceil(psi / 4) + 4 * FP32 * len(units)
    for rank, row in enumerate(per_rank(trainers, ZERO3)):
        assert row["param_bytes"] == resident, f"rank {rank}: {row}"
        assert row["grad_bytes"] == resident, f"rank {rank}: {row}"
        assert row["optim_bytes"] == 2 * resident, f"rank {rank}: {row}"
    record = trainers.records(ZERO3)[-1]
    assert record["param_gathered_peak_bytes"] == (padded[0] + 2 * padded[1]) * FP32, record


def test_pp2_stages_hold_their_layers(trainers):
    """Stage 0: embedding, positions, layer 0; stage 1: layer 1, final norm, the tied head copy."""
    ranks = per_rank(trainers, PIPELINE)
    first = EMBED + POS + LAYER
    last = LAYER + FINAL_NORM + EMBED
    first_tensors, last_tensors = 2 + TENSORS_PER_LAYER, TENSORS_PER_LAYER + 2 + 1
    for row, psi, tensors in ((ranks[0], first, first_tensors), (ranks[1], last, last_tensors)):
        assert row["param_bytes"] == psi * FP32, row
        assert row["grad_bytes"] == psi * FP32, row
        assert row["optim_bytes"] == 2 * psi * FP32 + tensors * FP32, row


def test_hetero_zero1_shards_each_layer_over_its_own_dp(trainers):
    """Block 1 (tp 1, dp 2) is whole on each rank and its moments halved over the two dp
    ranks; the tp-2 part (block 0's shard, the embedding's, positions, and the final norm
    with the head tied to the embedding) has dp 1: its moments whole, as its parameters."""
    ranks = per_rank(trainers, HETERO_ZERO1)
    one = LAYER  # the tp-1 part's buffer, sliced over dp 2
    for rank, row in enumerate(ranks):
        local = row["param_bytes"] // FP32
        two = local - one  # this rank's tp-2 part: its own buffer, one dp rank
        assert EMBED // 2 + POS < two < EMBED + POS + LAYER, f"rank {rank}: {row}"
        assert row["optim_bytes"] == 2 * (two + math.ceil(one / 2)) * FP32, f"rank {rank}: {row}"
        assert row["grad_bytes"] == local * FP32, f"rank {rank}: {row}"  # ZeRO-1 keeps whole gradients


def test_saved_activations_fall_with_recompute(trainers):
    peaks = {mode: per_rank(trainers, case)[0]["activation_peak_bytes"] for mode, case in RECOMPUTE.items()}
    assert peaks["none"] > peaks["selective"] > peaks["full"] > 0, peaks
