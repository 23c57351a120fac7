"""Bytes handed to communication per step, by axis, summed over ranks (``comm_bytes`` in the log).

Takes: the tensors the data-parallel gradient reduction (``dp.py``, ``compress.py``, ZeRO's
``zero.py`` and ``fsdp.py``), ZeRO's parameter all-gathers (``zero.py``, ``fsdp_units.py``)
and the pipeline's sends and tied-embedding sum (``pipeline.py``) give to a collective or a send. Gives:
``comm_bytes``, one counter per process: ``add(axis, tensor)``, ``reset()`` at the start of
a step, ``by_axis()`` for the step's record. Before: nothing (leaf module). After:
train.py logs ``"comm_bytes": traffic.comm_bytes.by_axis()`` each logged step.

Note [comm bytes]: the figure is the payload each rank passes to the collective (an
all-reduce's buffer, an all-gather's own part, a send's tensor), not the bytes a
ring algorithm puts on the wire (2·(n-1)/n of an all-reduce's buffer): the same
measure for a compressed and an uncompressed layout, so their ratio is the saving.
A reduce-scatter counts its input (the whole buffer each rank hands in, as an
all-reduce does), so in fp32 ZeRO-2's ``dp`` bytes are zero 0's, and ZeRO-3's those plus
its units' padding; the parameters ZeRO all-gathers back are ``dp_params``, apart, so
``dp`` stays the gradient reduction that compression shrinks.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

AXES = ("dp", "dp_params", "pp_forward", "pp_backward", "pp_embedding")
"""What is counted: the dp gradient reduction (the experts' over edp too, and under
HSDP the shards' sum over the other nodes), ZeRO's parameter all-gathers
over the shard group (stages 1 and 2: each rank's slice after the step; stage 3: each
unit's shard at every gather, forward and backward), the pipeline's activations (forward) and
input gradients (backward: the part the pipeline's codec compresses, parallel/pipeline/), and the
tied embedding's separate sum over its first and last stage copies (``pipeline.allreduce_tied_grads``;
none when that sum is fused into the dp all-reduce: Note [fused embedding synchronization]
in pipeline.py)."""


class Traffic:
    __slots__ = ("_bytes",)

    def __init__(self) -> None:
        self._bytes = dict.fromkeys(AXES, 0)

    def add(self, axis: str, tensor: torch.Tensor) -> None:
        self._bytes[axis] += tensor.numel() * tensor.element_size()

    def reset(self) -> None:
        self._bytes = dict.fromkeys(AXES, 0)

    @contextmanager
    def excluded(self):
        """``with``: the block's bytes are not the step's (evaluation, between the step and its record)."""
        saved = dict(self._bytes)
        try:
            yield
        finally:
            self._bytes = saved

    def by_axis(self) -> dict[str, int]:
        """The step's bytes summed over every rank, by axis (those not zero).

        Collective: every rank calls it at the same step (train.py's log step). Stages
        send different things (the first stage no gradients, the last no activations),
        so one rank's figure would not show the pipeline's traffic.
        """
        counts = torch.tensor([self._bytes[axis] for axis in AXES], dtype=torch.int64)
        if dist.is_initialized() and dist.get_world_size() > 1:
            on_gpu = dist.get_backend() == "nccl"
            counts = counts.cuda() if on_gpu else counts
            dist.all_reduce(counts)
        return {axis: int(n) for axis, n in zip(AXES, counts.tolist()) if n}


comm_bytes = Traffic()
"""This process's counter."""
