"""The experts' process groups: the dp·cp·tp ranks of a stage read again as edp·ep·etp.

Takes: a ``Mesh`` and the expert layers' degrees (ep, etp). Gives: ``expert_partitions``
(every stage's ep, edp and etp groups, as lists of global ranks) and ``expert_groups``
(this rank's three process groups: train.py calls it when the experts fold the ranks, the
``expert folding`` entry of codegen/features.py; fsdp_units.py splits the edp partition by
node). Only a build with experts ships this module.

Note [parallel folding]: expert layers re-read the dp·cp·tp ranks of a pipeline stage (in
rank order, j) as edp·ep·etp, etp innermost: the ep group holds the ranks with the same
j // (ep·etp) and j % etp, the edp group those with the same (j // etp) % ep and j % etp,
the etp group those with the same j // etp (so with etp ≤ tp it lies inside a tp group,
on one node).
"""

from __future__ import annotations

import torch.distributed as dist

from ..layout.axes import group_ranks


def expert_groups(mesh, ep: int, etp: int = 1):
    """This rank's ep, edp and etp process groups, in that order, None for a group of one (Note
    [parallel folding]). Every rank calls it, in the same order (new_group is collective)."""
    mine = {}
    for kind, partition in expert_partitions(mesh, ep, etp).items():
        for ranks in partition:
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if mesh.rank in ranks:
                mine[kind] = group
    return mine["ep"], mine["edp"], mine["etp"]


def expert_partitions(mesh, ep: int, etp: int = 1) -> dict[str, list[list[int]]]:
    """The ep, edp and etp groups of every stage, as lists of global ranks (fsdp_units.py
    splits edp by node)."""
    folds = tuple(name for name, _ in mesh.axes if name in ("dp", "cp", "tp"))
    stages = sorted({tuple(group_ranks(r, mesh.axes, folds)) for r in range(dist.get_world_size())})
    folded = len(stages[0])
    if folded % (ep * etp):
        raise ValueError(f"ep·etp = {ep}·{etp} does not divide the {folded} dp·cp·tp ranks of a stage")
    keys = (("ep", lambda j: (j // (ep * etp), j % etp)), ("edp", lambda j: ((j // etp) % ep, j % etp)),
            ("etp", lambda j: j // etp))
    partitions = {}
    for kind, key in keys:
        partitions[kind] = []
        for stage in stages:
            by_key = {}
            for j, rank in enumerate(stage):
                by_key.setdefault(key(j), []).append(rank)
            partitions[kind] += list(by_key.values())
    return partitions
