"""The cost of ``parallel.compress = powersgd`` or ``topk`` and of ``compress_pp = lowrank``: the bytes and the compute.

Takes: ``Hardware``, the weight matrices one rank reduces (each block's linear weights
on one tp rank, the embedding) and its parameter count, the rank r, the dp group.
Gives: ``powersgd_cost``, ``topk_cost`` and ``lowrank_backprop_cost``, seconds of communication and of compute and the bytes before
and after. Before: ``cost/comm.py``. After: ``cost/time.py`` (the dp term) and
``planner/why.py`` (the line saying what compression buys and that numerics change).

Note [powersgd cost]: runtime/parallel/data/compress.py (Note [powersgd]) sends, for each matrix of
n × m that gains (r·(n + m) < n·m), P (n × r) and Q (m × r) in two all-reduces, and
the rest (vectors) whole in a third; fp32. Its compute is two GEMMs per matrix (M·Q,
Mᵀ·P: 2·n·m·r flops each) and the decompression P·Qᵀ (as many), plus a QR of P
(≈ 2·n·r² flops), and reading the gradient and the error (memory bound). None of it is
overlapped with backward: the reduction runs after the last micro-batch (unlike zero
0's buckets, which hide behind backward), so a compressed layout wins only where the
network is slow enough that the bytes saved outweigh that exposed time: typically
dp spanning nodes over commodity links.

Note [topk cost]: runtime/parallel/data/compress.py (Note [topk]) sends k = ⌈ratio·Ψ⌉ (value fp32,
index int32) pairs of the rank's flat gradient in two all-gathers: each rank receives
every rank's k pairs, so what moves grows with dp (dp·8k bytes in, against the 2·4Ψ of
an exact ring all-reduce): top-k gains most over few, slow dp ranks. Its compute is
memory bound: reading the gradient and the error, the selection over |g + e|, writing
the error back, the scatter of dp·k entries and the mean into the gradients (about six
passes over 4Ψ bytes). Exposed, after backward, as PowerSGD's.

Note [compress_pp cost]: runtime/parallel/pipeline/compress_pp.py (Note [compressed backpropagation])
sends a compressing stage's input gradient, M of rows = micro_batch·T (this rank's
tokens) by cols = hidden, as P (rows × r) and Q (cols × r) in fp32: 4·r·(rows + cols)
bytes instead of rows·cols elements. Its compute is the sender's M·Q and Mᵀ·P, the
receiver's P·Qᵀ (2·rows·cols·r flops each; lazy error adds the sender's P·Qᵀ), a QR
of M·Q, and two memory passes over M; it lies on the backward's critical path, so it
is added to the backward of a chunk. The forward messages stay exact. The schedule
model (``cost/bubble.py``) takes one message time for both directions, the mean of
the forward's and the backward's (its closed form counts one of each per unit), over
the boundaries ``compress_stages`` selects (default: all).
"""

from __future__ import annotations

import math

from dataclasses import dataclass

from .comm import collective_time
from .hardware import Hardware

RANK = 4
"""The rank ``compress = auto`` turns on (``powersgd(rank = 4)``, the key's default)."""


@dataclass(frozen=True, slots=True)
class CompressionCost:
    comm_s: float
    compute_s: float
    exact_bytes: float
    compressed_bytes: float


def powersgd_cost(hw: Hardware, matrices, *, params: int, rank: int, size: int, stride: int) -> CompressionCost:
    """``matrices``: (n, m, how many) of this rank's weight gradients; Note [powersgd cost]."""
    # runtime/parallel/data/compress.py's powersgd_pays (that module needs torch; the planner does not import it)
    low = [(n, m, count) for n, m, count in matrices if rank * (n + m) < n * m]
    dense = sum(n * m * count for n, m, count in low)
    p_elements = sum(n * rank * count for n, m, count in low)
    q_elements = sum(m * rank * count for n, m, count in low)
    whole = max(0, params - dense)
    comm = sum(collective_time(hw, "all_reduce", 4.0 * elements, size=size, stride=stride)
               for elements in (p_elements, q_elements, whole))
    flops = sum(count * (3 * 2.0 * n * m * rank + 2.0 * n * rank * rank) for n, m, count in low)
    compute = flops / hw.matmul_flops(rank) * hw.gemm_scale + 3 * 4.0 * dense / hw.memory_bandwidth
    return CompressionCost(
        comm_s=comm, compute_s=compute * hw.contention, exact_bytes=4.0 * params,
        compressed_bytes=4.0 * (p_elements + q_elements + whole),
    )


TOPK_PASSES = 6
"""Memory passes over the rank's fp32 gradient that top-k's compression makes (Note [topk cost])."""


def topk_cost(hw: Hardware, *, params: int, ratio: float, size: int, stride: int) -> CompressionCost:
    """Top-k of ``params`` gradient elements over ``size`` dp ranks; Note [topk cost]."""
    k = max(1, math.ceil(ratio * params))
    comm = 2 * collective_time(hw, "all_gather", 4.0 * k * size, size=size, stride=stride)  # values, indices
    compute = (TOPK_PASSES * 4.0 * params + 8.0 * k * size) / hw.memory_bandwidth
    return CompressionCost(
        comm_s=comm, compute_s=compute * hw.contention, exact_bytes=4.0 * params, compressed_bytes=8.0 * k,
    )


def lowrank_backprop_cost(hw: Hardware, *, rows: int, cols: int, rank: int, lazy_error: bool,
                          stride: int) -> CompressionCost:
    """One backward message of ``rows`` × ``cols`` (a stage's input gradient) sent as
    Optimus-CC's low rank; Note [compress_pp cost]."""
    matmuls = 3 + (1 if lazy_error else 0)  # M·Q, Mᵀ·P, the receiver's P·Qᵀ (and the error's)
    flops = matmuls * 2.0 * rows * cols * rank + 2.0 * rows * rank * rank  # + the QR of M·Q
    compute = flops / hw.matmul_flops(rank) * hw.gemm_scale + 2 * 4.0 * rows * cols / hw.memory_bandwidth
    compressed = 4.0 * rank * (rows + cols)  # P and Q, fp32
    return CompressionCost(
        comm_s=collective_time(hw, "send_recv", compressed, size=2, stride=stride),
        compute_s=compute * hw.contention, exact_bytes=4.0 * rows * cols, compressed_bytes=compressed,
    )


def compresses(spec) -> bool:
    """Some gradient is compressed: the dp reduction's (``compress``) or the pipeline's
    backward messages (``compress_pp``)."""
    par = spec.parallel
    return par.compress not in (None, "none") or par.compress_pp not in (None, "none")


def pipeline_messages(spec, hw: Hardware, p2p: float, *, rows: int, stages: int, stride: int) -> tuple[float, float]:
    """(one stage-to-stage message's seconds, compression seconds a chunk's backward adds)
    under ``compress_pp`` (Note [compress_pp cost]): ``p2p`` the exact message of ``rows`` ×
    hidden, and (``p2p``, 0) when the pipeline's messages are exact."""
    par = spec.parallel
    if par.compress_pp == "none":
        return p2p, 0.0
    lowrank = lowrank_backprop_cost(hw, rows=rows, cols=spec.model.hidden, rank=par.compress_pp_rank,
                                    lazy_error=par.compress_pp_lazy_error, stride=stride)
    share = len(par.compress_stages or range(1, stages)) / (stages - 1)  # the boundaries that compress
    return (p2p + share * lowrank.comm_s + (1 - share) * p2p) / 2, share * lowrank.compute_s
