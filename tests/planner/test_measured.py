"""Predicted bytes against a real trainer's: ``parc build`` + torchrun on CPU gloo, the
metrics JSONL's ``memory_per_rank`` (runtime/train/memory.py's definitions).

Parameters, gradients and optimizer state must be equal to the byte; the peak of saved
activations within 10%, on every rank. Four 4-rank runs (one step each) cover dp 2
with zero 0, 1 and 2, tp 2 with sp, pp 2 (both stages: embedding, head, tied copy),
gpt and llama, selective recompute, pp 2 under zero_bubble, and 2D tp grids. The runs share the parity suite's launch of
their world size (tests/conftest.py's ``trainers``).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from parc.codegen.planner.cost.memory import memory
from parc.codegen.planner.search import fixed_layout
from parc.dsl import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the parity package
from parity.batch import SPECS, Case  # noqa: E402

CASES = {
    "gpt dp2·tp2 sp zero2": ("gpt.par", dict(dp=2, tp=2, sp="true", zero=2)),
    "llama dp2·pp2 zero1": ("llama.par", dict(dp=2, pp=2, zero=1)),
    "llama dp2·pp2 zero0 selective": ("llama.par", dict(dp=2, pp=2, zero=0, recompute="selective")),
    # zero_bubble keeps a micro-batch's graph from F to W: min(pp, M) in flight on every rank
    "gpt dp2·pp2 zero_bubble": ("gpt.par", dict(dp=2, pp=2, zero=0, schedule="zero_bubble")),
    # ZeRO-3: shards padded per unit (runtime/parallel/data/fsdp.py); gathered parameters are not activations
    "gpt dp4 zero3": ("gpt.par", dict(dp=4, zero=3)),
    "llama dp2·pp2 zero3": ("llama.par", dict(dp=2, pp=2, zero=3)),
    # bf16 parameters with fp32 masters (runtime/optimizers/master.py): 2-byte activations, no weight copies
    "gpt dp2 bf16": ("gpt.par", dict(dp=2, precision="bf16")),
    # low precision with sharded optimizers: fp32 master slices and shards
    "gpt dp2 zero3 bf16": ("gpt.par", dict(dp=2, zero=3, precision="bf16")),
    "llama dp2 zero1 bf16": ("llama.par", dict(dp=2, zero=1, precision="bf16")),
    # fp16 the same (the loss scale costs no bytes)
    "gpt dp2 fp16": ("gpt.par", dict(dp=2, precision="fp16")),
    # mixture of experts (cost/experts.py): routed rows' activations; experts split over ep,
    # sharded over edp under ZeRO (runtime/parallel/data/zero.py, Note [experts under ZeRO])
    "llama moe dp2 ep2 zero1": ("llama.par", dict(dp=2, ep=2, zero=1, experts=4)),
    # ep4 on dp4: one ep group holds every token, so the step's expert_tokens give each rank's share
    "llama moe dp4 ep4 zero2": ("llama.par", dict(dp=4, ep=4, zero=2, experts=4)),
    "llama moe dp2 zero0 every2 shared1": ("llama.par", dict(dp=2, experts=4, moe_every=2, shared_experts=1)),
    # ZeRO-3 with ep: the experts' units sharded over edp (runtime/parallel/data/fsdp.py, Note [experts as units])
    "llama moe dp4 ep2 zero3": ("llama.par", dict(dp=4, ep=2, zero=3, experts=4)),
    # etp: each rank 1/etp of its experts' ffn, running its etp group's rows (Note [expert tensor parallelism])
    "llama moe dp2·tp2 ep2 etp2": ("llama.par", dict(dp=2, tp=2, ep=2, etp=2, experts=4)),
    # ep over tp (Note [expert dispatch under tp]): each tp rank dispatches a share, rows gathered back
    "llama moe dp2·tp2 ep4": ("llama.par", dict(dp=2, tp=2, ep=4, experts=4)),
    # under sp each tp rank routes its own shard: the router's and the combine's tensors per shard
    "llama moe dp2·tp2 ep2 sp": ("llama.par", dict(dp=2, tp=2, ep=2, sp="true", experts=4)),
    # 2D tensor parallelism (Note [2D tensor parallelism]): the attention repeated on a
    # column's R ranks, the eager 2D norms; with sp the stream's T/C tokens (saved_elements.py)
    "gpt tp4 2x2": ("gpt.par", dict(tp=4, tp_shape="(2, 2)")),
    "llama tp4 2x2 sp": ("llama.par", dict(tp=4, sp="true", tp_shape="(2, 2)")),
    "gpt dp2·tp2 2x1 sp zero2": ("gpt.par", dict(dp=2, tp=2, sp="true", zero=2, tp_shape="(2, 1)")),
    "gpt dp2·tp2 2x1 zero3": ("gpt.par", dict(dp=2, tp=2, zero=3, tp_shape="(2, 1)")),
}


def _overrides(degrees: dict) -> list[str]:
    dp, tp, pp = degrees.get("dp", 1), degrees.get("tp", 1), degrees.get("pp", 1)
    return [
        f"parallel.dp={dp}", f"parallel.tp={tp}", f"parallel.pp={pp}",
        f"parallel.sp={degrees.get('sp', 'false')}", f"parallel.zero={degrees.get('zero', 0)}",
        f"parallel.recompute={degrees.get('recompute', 'none')}", f"mesh.devices_per_node={dp * tp * pp}",
        f"parallel.schedule={degrees.get('schedule', '1f1b')}",
    ] + ([f"train.precision={degrees['precision']}"] if "precision" in degrees else []) + [
        f"model.{key}={degrees[key]}" for key in ("experts", "moe_every", "shared_experts") if key in degrees
    ] + [f"parallel.{key}={degrees[key]}" for key in ("ep", "etp", "tp_shape") if key in degrees]


def measured_case(case: str) -> Case:
    spec_name, degrees = CASES[case]
    nproc = degrees.get("dp", 1) * degrees.get("tp", 1) * degrees.get("pp", 1)
    name = "measured-" + "-".join(case.replace("·", " ").split())
    return Case(name, spec_name, tuple(_overrides(degrees)), nproc, ("--steps", "1"))


def cases_of(item) -> list[Case]:
    """The runs a selected test of this module reads (tests/conftest.py's ``trainers``)."""
    if item.originalname == "test_predicted_bytes_equal_measured":
        return [measured_case(item.callspec.params["case"])]
    return []


def routed_share(expert_tokens: dict, ep_rank: int, ep: int) -> float:
    """The tokens routed to ep rank ``ep_rank``'s experts over the mean, averaged over the
    MoE layers (each layer's routed activations scale with its own)."""
    shares = []
    for counts in expert_tokens.values():
        local = len(counts) // ep
        shares.append(sum(counts[ep_rank * local : (ep_rank + 1) * local]) * ep / sum(counts))
    return sum(shares) / len(shares)


@pytest.mark.parametrize("case", list(CASES))
def test_predicted_bytes_equal_measured(case, trainers):
    spec_name, degrees = CASES[case]
    sets = _overrides(degrees)
    spec = load(str(SPECS / spec_name), sets)
    layout = fixed_layout(spec)
    predicted = memory(spec, layout).per_rank
    records = trainers.records(measured_case(case))
    ranks = records[-1]["memory_per_rank"]
    assert len(ranks) == layout.dp * layout.tp * layout.pp
    for rank, row in enumerate(ranks):
        pipeline_rank = rank // (layout.dp * layout.tp)  # mesh order pp, dp, tp (runtime/layout/axes.py)
        want = predicted[pipeline_rank]
        if layout.ep > 1:  # this rank's experts' share of the routed tokens: the planner's imbalance
            ep_rank = rank % (layout.dp * layout.tp) // layout.etp % layout.ep  # expert_folding.py's Note [parallel folding]
            imbalance = routed_share(records[-1]["expert_tokens"], ep_rank, layout.ep)
            skewed = replace(spec, model=replace(spec.model, routing_imbalance=imbalance))
            want = memory(skewed, layout).per_rank[pipeline_rank]
        got = (row["param_bytes"], row["grad_bytes"], row["optim_bytes"])
        assert got == (want.params, want.grads, want.optimizer), f"{case}, rank {rank}"
        measured = row["activation_peak_bytes"]
        assert want.activations == pytest.approx(measured, rel=0.10), f"{case}, rank {rank}: {want.activations} vs {measured}"
