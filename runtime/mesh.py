"""Processes and process groups.

Takes: torchrun's RANK / WORLD_SIZE / LOCAL_RANK and the mesh axes of the plan.
Gives: ``Dist`` (this process) and ``Mesh`` (coordinates and one group per axis).
Rank r's coordinates are the mixed-radix digits of r, last axis fastest, so the
innermost axis (tp) keeps its ranks on one node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def coordinates(rank: int, axes: tuple[tuple[str, int], ...]) -> dict[str, int]:
    """Mixed-radix digits of ``rank`` over ``axes`` (outermost first, last fastest)."""
    coords = {}
    for name, size in reversed(axes):
        coords[name] = rank % size
        rank //= size
    return {name: coords[name] for name, _ in axes}


def axis_ranks(rank: int, axes: tuple[tuple[str, int], ...], axis: str) -> tuple[int, ...]:
    """Global ranks that share every coordinate of ``rank`` except ``axis``."""
    strides, stride = {}, 1
    for name, size in reversed(axes):
        strides[name] = stride
        stride *= size
    sizes = dict(axes)
    base = rank - coordinates(rank, axes)[axis] * strides[axis]
    return tuple(base + i * strides[axis] for i in range(sizes[axis]))


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
        for name, size in self.axes:
            if size == 1:
                self._groups[name] = None
                continue
            for first in range(world):
                ranks = axis_ranks(first, self.axes, name)
                if ranks[0] != first:
                    continue
                group = dist.new_group(list(ranks))
                if self.rank in ranks:
                    self._groups[name] = group

    def size(self, axis: str) -> int:
        return dict(self.axes)[axis]

    def index(self, axis: str) -> int:
        return self.coords[axis]

    def ranks(self, axis: str) -> tuple[int, ...]:
        return axis_ranks(self.rank, self.axes, axis)

    def group(self, axis: str):
        """The process group along ``axis`` (None when the axis has size 1)."""
        return self._groups[axis]
