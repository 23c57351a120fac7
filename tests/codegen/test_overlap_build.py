"""`overlap = sub_batch(k)` and data-parallel overlap in the generated trainer and the plan."""

from __future__ import annotations

from pathlib import Path

from parc.codegen.build import generate
from parc.codegen.lower import lower
from parc.dsl import load

SPEC = Path(__file__).resolve().parents[1] / "parity" / "specs" / "gpt.par"


def build(*sets: str) -> tuple[str, str]:
    spec = load(str(SPEC), list(sets))
    return generate(spec)["train.py"].decode(), str(lower(spec))


def test_sub_batches_are_cited_and_passed_to_the_model():
    train, plan = build("parallel.tp=2", "mesh.devices_per_node=2", "parallel.overlap=sub_batch(2)")
    assert "# --set 3: each micro-batch runs as 2 sub-batches (Oases): sub-batch i's\n" in train
    assert "# tensor-parallel all-reduce runs while sub-batch i+1 computes (runtime/parallel/tensor/overlap.py)\n" in train
    assert "\nOVERLAP_SUB_BATCHES = 2\n" in train
    assert "    net = parallelize.overlap(net, OVERLAP_SUB_BATCHES)\n" in train
    assert "  OVERLAP_SUB_BATCHES = 2  [--set 3]\n" in plan
    sp_train, _ = build("parallel.tp=2", "parallel.sp=true", "mesh.devices_per_node=2",
                        "parallel.overlap=sub_batch(2)")
    assert "# tensor-parallel reduce-scatter and all-gather along T runs while sub-batch i+1" in sp_train


def test_none_leaves_no_trace_but_the_exposed_clock():
    train, plan = build("parallel.tp=2", "mesh.devices_per_node=2")
    assert "OVERLAP_SUB_BATCHES" not in train and "sub_batches" not in train
    assert "OVERLAP_SUB_BATCHES" not in plan
    assert "comm.exposed_clock.reset()" in train
    assert '"exposed_comm_s": comm.exposed_clock.seconds()' in train


def test_data_parallel_buckets_overlap_and_finish_first():
    train, _ = build("parallel.dp=2", "parallel.tp=2", "parallel.sp=true", "mesh.devices_per_node=4")
    assert "dp.GradientBuckets(\n        net, dp_group, overlap=True, accumulations=GRAD_ACCUM\n    )" in train
    finish = train.index("grad_sync.finish()")
    # the buckets write the dp means back into .grad: before the SP sum changes them
    assert finish < train.index("model.allreduce_sequence_parallel_grads(net, tp_group)")
