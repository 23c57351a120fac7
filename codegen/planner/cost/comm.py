"""Collective times: the α–β model per link level, or the machine's measured figures.

Takes: ``Hardware`` and a group (its size and stride in the rank numbering). Gives:
``link_for`` (which link a group's ring crosses) and ``collective_time`` for
all-reduce, all-gather, reduce-scatter and send/recv (``collective_latency``: the
part that does not shrink with the buffer; ``ring_time``: the α–β ring alone, which
``cost/overlap.py`` uses too). Before: ``cost/hardware.py``.
After: ``cost/time.py``.

Note [link levels]: ranks are numbered as ``runtime/layout/axes.py`` does,
tp innermost, then dp, pp outermost, and node ``rank // devices_per_node``. A group
of ``size`` ranks ``stride`` apart covers ``size·stride`` consecutive ranks; it stays
on one node when that span fits in a node, else its ring crosses the network. With
k of its members on each node, k network ports per node carry it (NCCL runs one ring
per port, each on 1/k of the buffer), so the network bandwidth is k × the per-device
figure, at most the in-node one. Ring costs, n ranks, B bytes of the buffer:
all-reduce 2(n−1)·α + 2(n−1)/n·B/β; all-gather and reduce-scatter (n−1)·α +
(n−1)/n·B/β; send/recv α + B/β. A profiled machine's measured (latency, bandwidth)
for the profiled rank count replaces α, β, rescaled by the same (n−1) factors.
"""

from __future__ import annotations

from .hardware import Hardware, Link

STEPS = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "send_recv": None}


def link_for(hw: Hardware, *, size: int, stride: int) -> Link:
    """Note [link levels]."""
    if size * stride <= hw.devices_per_node:
        return hw.intra
    per_node = max(1, min(size, hw.devices_per_node // stride))
    bandwidth = min(hw.intra.bandwidth, hw.inter.bandwidth * per_node)
    return Link(bandwidth=bandwidth, latency=hw.inter.latency)


def ring_time(kind: str, nbytes: float, *, ranks: int, link: Link) -> float:
    """Seconds for one ``kind`` collective of a ``nbytes`` buffer on a ring of ``ranks``
    over ``link`` (Note [link levels]'s costs); 0 for one rank or nothing to move."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    steps = STEPS[kind]
    if steps is None:
        return link.latency + nbytes / link.bandwidth
    return steps * (ranks - 1) * link.latency + steps * (ranks - 1) / ranks * nbytes / link.bandwidth


def collective_time(hw: Hardware, kind: str, nbytes: float, *, size: int, stride: int) -> float:
    """Seconds for one ``kind`` collective of a ``nbytes`` buffer over ``size`` ranks."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    measured = _measured(hw, kind, size=size, stride=stride)
    if measured is None:
        return ring_time(kind, nbytes, ranks=size, link=link_for(hw, size=size, stride=stride))
    if STEPS[kind] is None:
        return measured.latency + nbytes / measured.bandwidth
    n0 = max(measured.ranks, 2)
    volume = nbytes * ((size - 1) / size) / ((n0 - 1) / n0)
    return measured.latency * (size - 1) / (n0 - 1) + volume / measured.bandwidth


def collective_latency(hw: Hardware, kind: str, *, size: int, stride: int) -> float:
    """The part of ``collective_time`` that does not shrink with the buffer: splitting a
    collective in k pieces (overlap's sub-batches) pays it k times."""
    if size <= 1:
        return 0.0
    measured = _measured(hw, kind, size=size, stride=stride)
    if measured is None:
        latency = link_for(hw, size=size, stride=stride).latency
        return latency if STEPS[kind] is None else STEPS[kind] * (size - 1) * latency
    if STEPS[kind] is None:
        return measured.latency
    return measured.latency * (size - 1) / (max(measured.ranks, 2) - 1)


def _measured(hw: Hardware, kind: str, *, size: int, stride: int):
    """A profile's measurement of ``kind``, when it applies: a group within one node."""
    measured = hw.collective(kind)
    return measured if measured is not None and size * stride <= hw.devices_per_node else None
