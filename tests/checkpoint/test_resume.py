"""Resume equivalence and resharding: checkpoints continue a run exactly, in any layout.

Resume: 8 steps straight vs 4 steps, save, new processes, resume, 4 steps — the same
losses bit for bit and the same final tensors (``torch.equal``: parameters, both AdamW
moments, the RNG states), in dp2, tp2, pp2 (tied embedding across stages; with
dropout, so each rank's restored RNG state decides the masks) and ZeRO-1 over dp2
(moments in flat slices that cross parameter boundaries), context parallel with
ZeRO-1 over dp × cp, and ZeRO-3 (parameters too held only as per-block shards).
Reshard: a checkpoint saved under one layout, loaded under another and saved again
straight away, holds the same logical tensors bit for bit (parameters and moments);
and the next step's loss matches the run that never changed layout within 1e-5.

The runs: every layout's 8-step run and every resume and reshard of the tests selected,
in one launch per world size and phase (tests/conftest.py's ``trainers``, Note [one
launch, many trainers] in tests/parity/batch_worker.py): the straight runs first, then
the runs that read their checkpoints. Each test still reads only its own runs.
"""

from __future__ import annotations

import pytest
import torch

from parc.runtime.checkpoints import checkpoint_read
from parity.batch import Case

from .trainer import LAYOUTS, RESHARD_WORKER, STEPS, losses, overrides

RESUMED = ["dp2", "tp2", "pp2_dropout", "zero1_dp2", "cp2_zero1_dp2", "zero3_dp2", "moe_ep2", "hetero_tp21",
           "pp2_chimera", "tp2_2x1", "cp2_ring_dropout"]
RESHARDED = [
    ("dp2", "tp2"), ("dp2", "pp2"), ("zero1_dp2", "tp2"), ("cp2_zero1_dp2", "tp2"),
    ("zero3_dp2", "tp2"), ("tp2", "zero3_dp2"),  # zero 3 ⇄ zero 0 with tp
    ("zero3_dp2_tp2_overlap2", "tp2"),  # ZeRO-3's shards saved from the sub-batch wavefront
    ("moe_ep2", "moe_one"), ("moe_ep2", "moe_tp2"), ("moe_ep2_zero1", "moe_one"), ("cp2_ring", "one"),
    ("moe_etp2_dp2_zero1", "moe_ep2"), ("moe_ep2_dp4_zero3", "moe_tp2"),  # each expert's ffn halves → whole experts split over ep
    ("moe_cp2_ep2", "moe_one"),  # experts split over an ep group of cp ranks → whole on one rank
    ("moe_ep2_dp4_zero3_node", "moe_one"),  # HSDP's node shards (experts' too) → whole on one rank
    ("cp2_ring", "tp2"),
    ("dp2", "hetero_tp21"), ("hetero_tp21", "dp2"),  # checkpoints stay layout-free
    ("zero1_dp2", "hetero_tp21_zero1"), ("hetero_tp21_zero1", "zero1_dp2"),  # ZeRO-1 slices per layer
    ("zero3_dp2", "hetero_tp21_zero3"), ("hetero_tp21_zero3", "zero3_dp2"),  # ZeRO-3 units per layer
    ("pp2_chimera", "dp2"), ("dp2", "pp2_chimera"),  # chimera's replicas: saved once, both loaded
    ("pp2_dp2_zero3_chimera", "dp2"), ("dp2", "pp2_dp2_zero3_chimera"),  # ... as ZeRO-3 shards
    ("tp2", "tp4_2x2"), ("tp2_2x1", "tp2"),  # 1D tp ⇄ 2D tp: the same logical tensors
    ("pp2_dp2_zero3_zbv", "dp2_4layers"), ("dp2_4layers", "pp2_dp2_zero3_zbv"),  # ZeRO-3's units under ZB-V's V
    # TeraPipe with ZeRO-3 and recompute → tp 2; dp 2 → TeraPipe under sp (issue 33 item 7)
    ("pp2_dp2_zero3_terapipe_recompute", "tp2"), ("dp2", "pp2_tp2_sp_terapipe"),
    ("moe_pp2_terapipe", "moe_one"),  # experts in token slices → one rank
]


def straight(layout: str) -> Case:
    """8 steps without a break, saving at steps 4 and 8."""
    return Case(f"straight-{layout}", "gpt.par", tuple(overrides(layout)), LAYOUTS[layout][1],
                ("--steps", str(STEPS), "--checkpoint-dir", "{build}/ck", "--checkpoint-every", "4"))


def resumed(layout: str) -> Case:
    """The same build resumed from the straight run's step 4, for steps 5-8."""
    return Case(f"resumed-{layout}", "gpt.par", tuple(overrides(layout)), LAYOUTS[layout][1],
                ("--steps", str(STEPS), "--resume", f"{{build:straight-{layout}}}/ck/step_000004",
                 "--checkpoint-dir", "{build}/ck"), phase=1)


def resharded(source: str, target: str) -> Case:
    """``target``'s trainer loading ``source``'s step 4, saving it again at once (reshard_worker.py),
    then one step."""
    return Case(f"reshard-{source}-to-{target}", "gpt.par", tuple(overrides(target)), LAYOUTS[target][1],
                ("--steps", "5", "--resume", f"{{build:straight-{source}}}/ck/step_000004",
                 "--checkpoint-dir", "{build}/ck"), phase=1, script=str(RESHARD_WORKER))


def cases_of(item) -> list[Case]:
    """The runs a selected test of this module reads (tests/conftest.py's ``trainers``)."""
    if item.originalname == "test_resume_equivalence":
        layout = item.callspec.params["layout"]
        return [straight(layout), resumed(layout)]
    if item.originalname == "test_reshard":
        source, target = item.callspec.params["source"], item.callspec.params["target"]
        return [straight(source), resharded(source, target)]
    return []


@pytest.mark.parametrize("layout", RESUMED)
def test_resume_equivalence(layout, trainers):
    first, done = trainers.run(straight(layout)), trainers.run(resumed(layout))
    log = done.log.read_text()
    assert "resumed from" in log and "at step 4" in log
    assert [r["step"] for r in done.records] == [5, 6, 7, 8]  # steps 1-4 are not run again
    expected = {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in first.records}
    assert {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in done.records} == {s: expected[s] for s in (5, 6, 7, 8)}
    a = checkpoint_read.read_full(str(first.build / "ck" / "step_000008"))
    b = checkpoint_read.read_full(str(done.build / "ck" / "step_000008"))
    assert sorted(a) == sorted(b)
    assert any(k.endswith(".exp_avg_sq") for k in a) and "model.embed.weight" in a
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert not unequal, f"{layout}: tensors differ after resuming: {unequal[:5]}"


@pytest.mark.parametrize("source, target", RESHARDED)
def test_reshard(source, target, trainers):
    saved, done = trainers.run(straight(source)), trainers.run(resharded(source, target))
    assert "at step 4" in done.log.read_text()
    before = checkpoint_read.read_full(str(saved.build / "ck" / "step_000004"))
    after = checkpoint_read.read_full(str(done.build / "ck" / "step_000004"))  # saved by `target` on loading
    names = sorted(k for k in before if k.startswith(("model.", "optim.")))
    assert names == sorted(k for k in after if k.startswith(("model.", "optim.")))
    unequal = [k for k in names if not torch.equal(before[k], after[k])]
    assert not unequal, f"{source} -> {target}: loaded tensors differ: {unequal[:5]}"
    loss, reference = losses(done.records)[5], losses(saved.records)[5]
    assert abs(loss - reference) <= 1e-5 * abs(reference), (loss, reference)
