"""Pass 4: each rank's coordinates, node and local rank; the process groups.

Takes: ``draft.mesh`` with axes. Gives: ``draft.mesh`` with ``ranks`` and ``groups``.
A rank's coordinates are the mixed-radix digits of its number, the last (innermost)
axis fastest — the same rule as the runtime's ``Mesh`` (runtime-api.md), so the plan
says exactly which ranks the generated program groups together. The group of a rank
along an axis is the ranks that agree with it on every other axis.

Before: ``resolve_mesh``. After: ``partition_layers``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec

from ..plan import ProcessGroup, RankPlacement
from .draft import Draft


def coordinates(rank: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Mixed-radix digits of ``rank`` over ``sizes`` (outermost first, last fastest)."""
    digits = []
    for size in reversed(sizes):
        digits.append(rank % size)
        rank //= size
    return tuple(reversed(digits))


def run(spec: Spec, draft: Draft) -> Draft:
    mesh = draft.mesh
    names = tuple(axis.axis for axis in mesh.axes)
    sizes = tuple(axis.size for axis in mesh.axes)
    ranks = tuple(
        RankPlacement(
            rank=rank,
            node=rank // mesh.devices_per_node,
            local_rank=rank % mesh.devices_per_node,
            coords=tuple(zip(names, coordinates(rank, sizes))),
        )
        for rank in range(mesh.world_size)
    )
    groups = []
    for position, axis in enumerate(names):
        members: dict[tuple[int, ...], list[int]] = {}
        for placement in ranks:
            others = tuple(i for p, (_, i) in enumerate(placement.coords) if p != position)
            members.setdefault(others, []).append(placement.rank)
        ordered = sorted(tuple(group) for group in members.values())
        groups.extend(ProcessGroup(axis=axis, ranks=group) for group in ordered)
    return replace(draft, mesh=replace(mesh, ranks=ranks, groups=tuple(groups)))
