"""Fused embedding synchronization (pipeline.py, Note [fused embedding synchronization]),
checked inside rank_worker.py's 4-rank launch (no start-up of its own).

The four ranks as pp 2 × dp 2, each stage holding a copy of a tied table and a weight of
its own, with fp32 gradients every rank draws from its own seed. The separate sum (the
dp buckets, then ``allreduce_tied_grads`` over the two stages) and the fused one (the
table reduced over both stages × dp in the buckets' all-reduce) must both give the mean
over dp of the two copies' sum, and the fused one hands one collective and the table's
bytes less to communication: no ``pp_embedding`` bytes. The generated trainer's path is
the parity rows pp2-dp2 (and pp2-cp2-*: dp × cp) of tests/parity/test_parity.py, fused
by default.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from parc.runtime.layout.roles import assign
from parc.runtime.parallel.data import dp
from parc.runtime.distributed import mesh
from parc.runtime.parallel.pipeline import pipeline
from parc.runtime.distributed.traffic import comm_bytes

VOCAB, HIDDEN, OWN = 12, 8, 5
WORLD = 4


class Stage(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(VOCAB, HIDDEN))
        assign(self.table, tied_across_stages=True)
        self.own = nn.Parameter(torch.zeros(OWN, HIDDEN))

    def tied_weight(self):
        return self.table


def drawn(rank: int, name: str) -> torch.Tensor:
    """Quarters of small integers: their sums and halves are exact in fp32 in any order (dp.py
    sums and divides in fp32), so both ways must equal the expected mean to the last bit."""
    shape = (VOCAB, HIDDEN) if name == "table" else (OWN, HIDDEN)
    generator = torch.Generator().manual_seed(100 * rank + len(name))
    return torch.randint(-64, 64, shape, generator=generator).to(torch.float32) / 4


def _sync(grid, fused: bool, calls: list):
    stage = Stage()
    for name, p in stage.named_parameters():
        p.grad = drawn(grid.rank, name)
    comm_bytes.reset()
    before = len(calls)
    if fused:
        dp.GradientBuckets(stage, grid.group("dp"), tied_group=pipeline.embedding_group(grid, "dp")).finish()
    else:
        dp.GradientBuckets(stage, grid.group("dp")).finish()
        pipeline.allreduce_tied_grads([stage], pipeline.tied_embedding_group(grid))
    collectives = len(calls) - before
    return stage, comm_bytes.by_axis(), collectives


def check_embedding_sync(dist_info):
    """(what, actual, expected) triples; every rank, world 4 only."""
    grid = mesh.Mesh((("pp", 2), ("dp", 2), ("cp", 1), ("tp", 1)), dist_info)
    calls, all_reduce = [], dist.all_reduce

    def counted(*args, **kwargs):  # the modules call dist.all_reduce through the module
        calls.append(1)
        return all_reduce(*args, **kwargs)

    dist.all_reduce = counted
    try:
        (separate, separate_bytes, separate_calls), (fused, fused_bytes, fused_calls) = (
            _sync(grid, way, calls) for way in (False, True))
    finally:
        dist.all_reduce = all_reduce
    stage_ranks = (0, 1) if grid.rank < 2 else (2, 3)  # pp is the outer axis
    want = {"own": sum(drawn(r, "own") for r in stage_ranks) / 2,
            "table": sum(drawn(r, "table") for r in range(WORLD)) / 2}  # dp mean of the copies' sum
    table_bytes = VOCAB * HIDDEN * 4
    out = []
    for way, stage in (("separate", separate), ("fused", fused)):
        out += [(f"{way} {name} grad", p.grad, want[name]) for name, p in stage.named_parameters()]
    number = lambda n: torch.tensor(float(n), dtype=torch.float64)  # noqa: E731
    return out + [
        # every rank holds a copy: the separate sum moves the table again, in a collective of its own
        ("separate pp_embedding bytes", number(separate_bytes.get("pp_embedding", 0)), number(WORLD * table_bytes)),
        ("fused pp_embedding bytes", number(fused_bytes.get("pp_embedding", 0)), number(0)),
        ("dp bytes", number(fused_bytes["dp"]), number(separate_bytes["dp"])),
        ("dp bytes, all", number(fused_bytes["dp"]), number(WORLD * (VOCAB + OWN) * HIDDEN * 4)),
        # the own weight's bucket, the table's late bucket, the two stages' sum; fused: one less
        ("separate collectives", number(separate_calls), number(3)),
        ("fused collectives", number(fused_calls), number(2)),
    ]
