"""Processes and process groups.

Takes: torchrun's RANK / WORLD_SIZE / LOCAL_RANK and the mesh axes of the plan
(``MESH_AXES``, from the registry in ``axes.py``). Gives: ``Dist`` (this process) and
``Mesh`` (coordinates, and the process group over one axis or several). Rank r's
coordinates are the mixed-radix digits of r, last axis fastest (``axes.coordinates``),
so the innermost axis (tp) keeps its ranks on one node.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # noqa: F401  (before any group: Note [groups die before Python does])

from ..layout.axes import coordinates, group_ranks, partition


@dataclass(frozen=True, slots=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    """"gloo" or "nccl"; None when a single process runs without a process group."""


def init_distributed() -> Dist:
    """Join the job torchrun started (or run alone when launched as ``python``)."""
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if world_size > 1:
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    else:
        backend = None
    return Dist(rank, world_size, local_rank, device, backend)


def shutdown() -> None:
    """Leave the job: every process group, and with it gloo's worker threads, is gone.

    Call it after the code that used the groups has returned (the trainer's
    ``if __name__ == "__main__":`` block), not from inside it.

    Note [groups die before Python does]: a gloo worker thread can hold the last
    reference to a finished collective's tensors (``all_gather`` of a temporary, say)
    for a moment after the caller has moved on. Dropping it needs the GIL; if the
    interpreter is already finalizing, CPython ends that thread with ``pthread_exit``
    inside a ``noexcept`` frame and the process aborts with "terminate called without
    an active exception" — exit -6 after a run that trained correctly (about 1 in 10
    two-rank runs on this machine). ``destroy_process_group`` shuts the groups down but
    does not join those threads; the C++ group does, when its last reference goes.
    So once the trainer's objects (modules, optimizer, mesh — which hold the groups)
    have gone out of scope, collect the cycles among them: each group is destroyed
    here, with the GIL released while it joins its threads, and the threads finish
    their last release while Python is still whole. Two references outlived the
    trainer before: the parameters' gradient hooks (C++ → Python cycles gc cannot
    see; ``comm.on_gradient`` holds its object weakly), and the default arguments of
    ``torch.distributed.nn.functional`` (``group=group.WORLD``, evaluated when torch
    first imports it — inside AdamW's first step, after the world group exists), so
    this module imports it before any group is made.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def axis_ranks(rank: int, axes: tuple[tuple[str, int], ...], *names: str) -> tuple[int, ...]:
    """Global ranks that share every coordinate of ``rank`` except those along ``names``."""
    return group_ranks(rank, axes, names)


class Mesh:
    """This rank's place in the mesh and its process group along each axis."""

    def __init__(self, axes, dist_info: Dist):
        self.axes = tuple((str(name), int(size)) for name, size in axes)
        names = [name for name, _ in self.axes]
        if len(set(names)) != len(names) or any(size < 1 for _, size in self.axes):
            raise ValueError(f"mesh axes must have distinct names and sizes >= 1: {self.axes}")
        world = 1
        for _, size in self.axes:
            world *= size
        if world != dist_info.world_size:
            shape = " × ".join(f"{name} {size}" for name, size in self.axes)
            raise ValueError(
                f"this trainer's mesh ({shape}) needs {world} processes, "
                f"but WORLD_SIZE is {dist_info.world_size}: launch it with "
                f"torchrun --nproc-per-node {world}"
            )
        self.rank = dist_info.rank
        self.coords = coordinates(self.rank, self.axes)
        self._groups = {}
        # Every rank must create every group, in the same order (new_group is collective).
        for name, _ in self.axes:
            self._make((name,))

    def _make(self, names: tuple[str, ...]):
        size = 1
        for name in names:
            size *= self.size(name)
        mine = None
        if size > 1:
            for ranks in partition(self.axes, names):
                group = dist.new_group(list(ranks))
                if self.rank in ranks:
                    mine = group
        self._groups[names] = mine
        return mine

    def size(self, axis: str) -> int:
        return dict(self.axes)[axis]

    def index(self, axis: str) -> int:
        return self.coords[axis]

    def ranks(self, *axes: str) -> tuple[int, ...]:
        """The global ranks of this rank's group along ``axes``, ascending."""
        return axis_ranks(self.rank, self.axes, *axes)

    def tp_grid(self, shape):
        """This rank's place on the grid ``shape`` = (R, C) of its tp ranks and the groups
        along both sides (``layers2d.tensor_grid``); None for ``(1, tp)`` (1D). Every rank
        calls it, once (new_group is collective)."""
        if int(shape[0]) == 1:
            return None
        from ..parallel.tensor.layers2d import tensor_grid  # only a 2D build ships layers2d.py

        return tensor_grid(self, shape)

    def group(self, *axes: str):
        """The process group along one axis or several (None when it has one rank).

        ``group("tp")``; ``group("dp", "cp")`` spans both axes. The groups of single
        axes exist from the start; a group over several axes is made the first time it
        is asked for, so every rank must ask for it, in the same order.
        """
        names = tuple(name for name, _ in self.axes if name in axes)
        if len(names) != len(set(axes)):
            unknown = sorted(set(axes) - set(names))
            raise KeyError(f"no mesh axis {unknown[0]!r}; the axes are {[n for n, _ in self.axes]}")
        if names not in self._groups:
            return self._make(names)
        return self._groups[names]
