"""Bytes each rank hands to communication per step, by mesh axis (``comm_bytes`` in the log).

Takes: the tensors the data-parallel gradient reduction (``dp.py``, ``compress.py``)
and the pipeline's sends (``pipeline.py``) give to a collective or a send. Gives:
``comm_bytes``, one counter per process: ``add(axis, tensor)``, ``reset()`` at the start of
a step, ``by_axis()`` for the step's record. Before: nothing (leaf module). After:
train.py logs ``"comm_bytes": traffic.comm_bytes.by_axis()`` each step.

Note [comm bytes]: the figure is the payload this rank passes to the collective (an
all-reduce's buffer, an all-gather's own part, a send's tensor), not the bytes a
ring algorithm puts on the wire (2·(n-1)/n of an all-reduce's buffer): the same
measure for a compressed and an uncompressed layout, so their ratio is the saving.
"""

from __future__ import annotations

import torch


class Traffic:
    __slots__ = ("_bytes",)

    def __init__(self) -> None:
        self._bytes: dict[str, int] = {}

    def add(self, axis: str, tensor: torch.Tensor) -> None:
        self._bytes[axis] = self._bytes.get(axis, 0) + tensor.numel() * tensor.element_size()

    def reset(self) -> None:
        self._bytes = {}

    def by_axis(self) -> dict[str, int]:
        return dict(sorted(self._bytes.items()))


comm_bytes = Traffic()
"""This process's counter."""
