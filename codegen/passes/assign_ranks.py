"""Pass 4: each rank's coordinates, node and local rank; the process groups.

Takes: ``draft.mesh`` with axes. Gives: ``draft.mesh`` with ``ranks`` and ``groups``.
A rank's coordinates are the mixed-radix digits of its number, the last (innermost)
axis fastest — the runtime's own arithmetic (``runtime/axes.py``), so the plan
says exactly which ranks the generated program groups together. The group of a rank
along an axis is the ranks that agree with it on every other axis.

Before: ``resolve_mesh``. After: ``partition_layers``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec
from parc.runtime.axes import coordinates, partition

from ..plan import ProcessGroup, RankPlacement
from .draft import Draft


def run(spec: Spec, draft: Draft) -> Draft:
    mesh = draft.mesh
    axes = tuple((axis.axis, axis.size) for axis in mesh.axes)
    ranks = tuple(
        RankPlacement(
            rank=rank,
            node=rank // mesh.devices_per_node,
            local_rank=rank % mesh.devices_per_node,
            coords=tuple(coordinates(rank, axes).items()),
        )
        for rank in range(mesh.world_size)
    )
    groups = tuple(
        ProcessGroup(axis=name, ranks=ranks) for name, _ in axes for ranks in partition(axes, (name,))
    )
    return replace(draft, mesh=replace(mesh, ranks=ranks, groups=groups))
