"""Context parallel (`parallel.cp`, `parallel.cp_kind`) in the generated trainer and the plan."""

from __future__ import annotations

from pathlib import Path

from parc.codegen.build import generate
from parc.codegen.lower import lower
from parc.dsl import load

SPEC = Path(__file__).resolve().parents[1] / "parity" / "specs" / "gpt.par"


def build(*sets: str) -> tuple[dict, str]:
    spec = load(str(SPEC), list(sets))
    return generate(spec), str(lower(spec))


def test_cp_is_cited_grouped_and_passed_to_the_model():
    files, plan = build("parallel.dp=2", "parallel.cp=2", "parallel.cp_kind=ulysses", "mesh.devices_per_node=4")
    train = files["train.py"].decode()
    assert "\nCP = 2  # --set 2: context-parallel ranks\n" in train
    assert '\nCP_KIND = "ulysses"  # --set 3: all-to-all from sequence to head shards around attention\n' in train
    assert 'MESH_AXES = (("dp", DP), ("cp", CP), ("tp", TP))' in train
    assert '    cp_group = grid.group("cp")  # ranks that split each sequence\n' in train
    assert '    grad_group = grid.group("dp", "cp")  # ranks that average gradients and the loss\n' in train
    assert 'dp_group = grid.group("dp")' not in train  # nothing reduces over dp alone
    assert "    net = parallelize.context(net, cp_group, CP_KIND)\n" in train
    assert 'targets,\n                    cp_rank=grid.index("cp"),\n                    cp_size=CP,\n                    cp_kind=CP_KIND,\n' in train
    assert "step_loss = dp.all_reduce_mean(loss_sum, grad_group)  # global mean loss" in train
    assert "parc_runtime/parallel/context/context.py" in files
    assert "axes pp 1 × dp 2 × cp 2 × tp 1" in plan
    assert "  cp groups: [0,1] [2,3]\n" in plan


def test_cp_1_leaves_no_trace():
    files, _ = build("parallel.dp=2", "mesh.devices_per_node=2")
    train = files["train.py"].decode()
    assert "CP =" not in train and "CP_KIND" not in train and "cp_group" not in train and "context_chunk" not in train
    assert "parc_runtime/parallel/context/context.py" not in files and "parc_runtime/parallel/context/ring.py" not in files


def test_ring_is_the_default_kind_and_ships_ring():
    files, _ = build("parallel.dp=2", "parallel.cp=2", "mesh.devices_per_node=4")
    train = files["train.py"].decode()
    assert "ring attention: K/V blocks passed around cp, load-balanced chunks" in train
    assert "parc_runtime/parallel/context/ring.py" in files and "parc_runtime/parallel/context/context.py" in files
