"""Build the parity GPT in a layout and run its generated trainer, for the checkpoint tests.

Everything goes through what a user has: ``build_to`` (``parc build``), ``torchrun``
(or ``python train.py`` for one rank), the trainer's flags and ``--metrics-jsonl``.
The model has vocab 250, padded to 256, so the padding rows are in every checkpoint.
``reshard_worker.py`` wraps a trainer to save right after it resumes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from parc.codegen.build import build_to

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "tests" / "parity" / "specs"
TORCHRUN = Path(sys.executable).with_name("torchrun")
RESHARD_WORKER = Path(__file__).with_name("reshard_worker.py")
STEPS = 8

MOE = ["model.experts=4", "model.top_k=2"]
LAYOUTS = {  # name -> (--set overrides, ranks)
    "one": ([], 1),
    "dp2": (["parallel.dp=2"], 2),
    "tp2": (["parallel.tp=2"], 2),
    "pp2": (["parallel.pp=2"], 2),
    "pp2_dropout": (["parallel.pp=2", "model.dropout=0.1"], 2),  # the RNG states matter
    # chimera: each stage held twice (ranks r and p-1-r); the checkpoint holds it once
    "pp2_chimera": (["parallel.pp=2", "parallel.schedule=chimera"], 2),
    # ... under ZeRO-3: each replica's units sharded over its dp 2, the up copy saved by its partner
    "pp2_dp2_zero3_chimera": (["parallel.pp=2", "parallel.dp=2", "parallel.zero=3", "parallel.schedule=chimera"], 4),
    "zero1_dp2": (["parallel.dp=2", "parallel.zero=1"], 2),
    # context parallel: parameters replicated over cp, ZeRO-1 slices over dp × cp
    "cp2_zero1_dp2": (["parallel.dp=2", "parallel.cp=2", "parallel.cp_kind=allgather", "parallel.zero=1"], 4),
    # ZeRO-3: parameters and moments only in each block's shards (runtime/parallel/data/fsdp.py)
    "zero3_dp2": (["parallel.dp=2", "parallel.zero=3"], 2),
    # ... in overlap's sub-batch wavefront (Note [module hooks in the wavefront] in overlap.py)
    "zero3_dp2_tp2_overlap2": (["parallel.dp=2", "parallel.tp=2", "parallel.zero=3", "parallel.overlap=sub_batch(2)"], 4),
    # mixture of experts (runtime/parallel/expert/moe.py): under ep2 each rank holds 2 of the 4 experts
    "moe_ep2": ([*MOE, "parallel.dp=2", "parallel.ep=2"], 2),
    "moe_one": (MOE, 1),
    "moe_tp2": ([*MOE, "parallel.tp=2"], 2),
    # ZeRO-1 with ep: the experts' moments live in a flat buffer of their own (zero.py)
    "moe_ep2_zero1": ([*MOE, "parallel.dp=2", "parallel.ep=2", "parallel.zero=1"], 2),
    # expert tensor parallel (Note [expert tensor parallelism]): each rank half of every
    # expert's ffn, its moments in the experts' own flat buffer
    # ZeRO-3 with ep: the experts' units are sharded over edp (fsdp.py, Note [experts as units])
    "moe_ep2_dp4_zero3": ([*MOE, "parallel.dp=4", "parallel.ep=2", "parallel.zero=3"], 4),
    # ... under HSDP (2 "nodes" of 2): the dense units over a node's dp ranks, the experts' over
    # its edp ranks, each replicated over the other node (fsdp.py, Note [experts as units])
    "moe_ep2_dp4_zero3_node": ([*MOE, "parallel.dp=4", "parallel.ep=2", "parallel.zero=3",
                                "parallel.zero_shard=node", "mesh.nodes=2", "mesh.devices_per_node=2"], 4),
    "moe_etp2_dp2_zero1": ([*MOE, "parallel.dp=2", "parallel.etp=2", "parallel.zero=1"], 2),
    # context parallel with ep (moe.py, Note [MoE under context parallelism]): the ep group is
    # the two cp ranks, each holding 2 of the 4 experts and routing its own chunk of every sequence
    "moe_cp2_ep2": ([*MOE, "parallel.cp=2", "parallel.cp_kind=ring", "parallel.ep=2"], 2),
    # ring attention: each rank's tokens are two load-balanced chunks; the checkpoint is layout-free
    "cp2_ring": (["parallel.cp=2", "parallel.cp_kind=ring"], 2),
    # ... with attention dropout: the masks' seed comes from the RNG state the checkpoint keeps
    "cp2_ring_dropout": (["parallel.cp=2", "parallel.cp_kind=ring", "model.dropout=0.1"], 2),
    # ZeRO-3 under ZB-V (4 layers: two chunks a rank): rank 0 holds both copies of the tied embedding,
    # whose shards start alike but differ in size (runtime/checkpoints/checkpoint_dcp.py)
    "pp2_dp2_zero3_zbv": (["parallel.pp=2", "parallel.dp=2", "parallel.zero=3", "parallel.schedule=zero_bubble_v",
                           "model.layers=4"], 4),
    "dp2_4layers": (["parallel.dp=2", "model.layers=4"], 2),
    # TeraPipe (runtime/parallel/pipeline/terapipe.py) with ZeRO-3's per-slice gathers and a recompute,
    # with experts, and under sp (each tp rank its share of a slice): the checkpoint is layout-free
    "pp2_dp2_zero3_terapipe_recompute": (["parallel.pp=2", "parallel.dp=2", "parallel.zero=3",
                                          "parallel.schedule=terapipe(slices = 2)", "parallel.recompute=full"], 4),
    "moe_pp2_terapipe": ([*MOE, "parallel.pp=2", "parallel.schedule=terapipe(slices = [16, 8, 8])"], 2),
    "pp2_tp2_sp_terapipe": (["parallel.pp=2", "parallel.tp=2", "parallel.sp=true",
                             "parallel.schedule=terapipe(slices = [8, 16, 8])", "parallel.recompute=selective"], 4),
    # heterogeneous layout (runtime/parallel/data/hetero.py): block 0 tp 2 × dp 1, block 1 tp 1 × dp 2
    "hetero_tp21": (["parallel.tp=[2, 1]", "parallel.dp=[1, 2]"], 2),
    # 2D tensor parallelism (runtime/parallel/tensor/layers2d.py): weights split on an R × C grid of the tp ranks
    "tp2_2x1": (["parallel.tp=2", "parallel.tp_shape=(2, 1)"], 2),
    "tp4_2x2": (["parallel.tp=4", "parallel.tp_shape=(2, 2)"], 4),
    # ... with ZeRO-1: block 0's moments whole on each tp rank, block 1's sliced over its dp 2
    "hetero_tp21_zero1": (["parallel.tp=[2, 1]", "parallel.dp=[1, 2]", "parallel.zero=1"], 2),
    # ... with ZeRO-3: block 0's unit whole on each tp rank, block 1's sharded over its dp 2
    "hetero_tp21_zero3": (["parallel.tp=[2, 1]", "parallel.dp=[1, 2]", "parallel.zero=3"], 2),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def env(**extra) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PARC_", "TORCHELASTIC_"))}
    return dict(clean, OMP_NUM_THREADS="1", PYTHONHASHSEED="0", CUDA_VISIBLE_DEVICES="", **extra)


def overrides(layout: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The ``--set``s of ``layout``'s build of the parity GPT."""
    sets, ranks = LAYOUTS[layout]
    nodes = [] if any(s.startswith("mesh.devices_per_node=") for s in sets) else [f"mesh.devices_per_node={ranks}"]
    return [*sets, *nodes, f"train.steps={STEPS}", "model.vocab=250", *extra]


def build(layout: str, out: Path, *, spec: str = "gpt.par", extra: tuple[str, ...] = ()) -> Path:
    return Path(build_to(SPECS / spec, out, overrides(layout, extra)))


def command(build_dir: Path, ranks: int, args: list[str], *, script: Path | None = None,
            max_restarts: int = 0) -> list[str]:
    script = script or build_dir / "train.py"
    if ranks == 1 and script.name == "train.py":
        return [sys.executable, str(script), *args]
    return [
        str(TORCHRUN), f"--nproc-per-node={ranks}", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--max-restarts={max_restarts}",
        str(script), *args,
    ]


def run(build_dir: Path, ranks: int, args: list[str], *, expect: int | None = 0, extra_env=None,
        script: Path | None = None, max_restarts: int = 0, timeout: float = 300):
    """Run the trainer; the CompletedProcess (its exit status checked against ``expect``)."""
    done = subprocess.run(
        command(build_dir, ranks, args, script=script, max_restarts=max_restarts),
        env=env(**(extra_env or {})), capture_output=True, text=True, timeout=timeout, cwd=build_dir,
    )
    if expect is not None and done.returncode != expect:
        raise AssertionError(
            f"trainer exit {done.returncode}, expected {expect} ({build_dir}):\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-6000:]}"
        )
    return done


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses(rows: list[dict]) -> dict[int, float]:
    """step -> loss (a step logged twice, after a restart: the last one)."""
    return {row["step"]: row["loss"] for row in rows}
