"""The collectives of 2D tensor parallelism, per block and for the embedding and head.

Takes: a ``Spec``, a ``Layout`` with ``tp_shape = (R, C)`` and ``Hardware``. Gives:
``grid_block_comm`` (one block's tp seconds, forward and backward) and
``grid_head_comm`` (the embedding's, the head's and the loss's), which ``cost/time.py``
uses in place of 1D's two all-reduces of (b, s, h) per region. Before: ``cost/comm.py``.

Note [2D tp costs]: as ``runtime/parallel/tensor/layers2d.py`` runs them (Note [2D tensor parallelism]).
The tp rank is r·C + c: a row's C ranks are consecutive (stride 1, inside a node when C
divides devices_per_node), a column's R ranks stride C (across nodes when tp spans
them). Forward, each colwise linear (q, k, v; up, and gate for llama) all-reduces its
(tokens, out/C) partial product over its column (R ranks), each rowwise one (o_proj,
down_proj) its (tokens, hidden/R) over its row (C ranks); each norm sums (tokens,) row
statistics over the column (one all-reduce for RMSNorm, two for LayerNorm). Backward
mirrors it: a colwise linear's input gradient (tokens, hidden/R) over the row, a rowwise
one's (tokens, out/C) over the column, the norms' statistics again. Compared with 1D's
(tokens, hidden) over all tp ranks, the slow column ring carries 1/C of the projections'
outputs, which is ATP's point when tp spans nodes; inside one node 2D moves more.
Under sp (Note [2D sequence parallelism]) each all-reduce over a row becomes a
reduce-scatter plus an all-gather of the same tensor, the two halves of a ring all-reduce:
the same seconds, so the sums above stand for both.
"""

from __future__ import annotations

from parc.dsl.spec import Arch

from .comm import collective_time
from .options import Option


def _why(best, index: int, hw, flat, seconds) -> list[str]:
    """``why``'s line when the winner is a 2D tp grid: what 1D tp of the same degrees
    (``flat``, its estimate) would cost (ATP's claim: 2D pays when tp spans nodes; Note [2D
    tp costs]). ``seconds``: why's signed time format."""
    rows, cols = best.layout.tp_shape
    spans = best.layout.tp > hw.devices_per_node
    where = (f"tp {best.layout.tp} spans {best.layout.tp // hw.devices_per_node} nodes: each row of {cols} ranks "
             f"is on one node, each column of {rows} crosses the network" if spans else
             f"tp {best.layout.tp} is inside one node")
    verdict = "parc cannot build 1D tp across nodes (PAR0217); it would take" if spans else "1D would take"
    return [
        f"#{index} arranges tp as a {rows} × {cols} grid (tp_shape = ({rows}, {cols})): {where}. {verdict} "
        f"{seconds(flat.time.step - best.time.step)[1:]} {'more' if flat.time.step >= best.time.step else 'less'} "
        f"per step (exposed communication {seconds(flat.time.exposed_comm)[1:]} vs "
        f"{seconds(best.time.exposed_comm)[1:]})."
    ]


OPTIONS = (
    Option(name="tp_shape", default=None, axis="tp", words=lambda shape: f"{shape[0]}×{shape[1]}" if shape else None,
           of_plan=lambda plan: None if plan.mesh.tp_shape is None else tuple(plan.mesh.tp_shape.value),
           of_spec=lambda par: par.tp_shape if par.tp_shape is not None and par.tp_shape[0] > 1 else None,
           to_spec=lambda shape, par: {"tp_shape": par.tp_shape if shape is None else shape,
                                       "tp_shape_auto": False},
           auto=lambda par: par.tp_shape_auto,
           column=lambda layout: None if layout.tp_shape is None else "tp{}×{}".format(*layout.tp_shape),
           compared=True, shown=lambda shape: "1D" if shape is None else f"({shape[0]}, {shape[1]})",
           reasons={"exposed_comm": (
               "a 2D tp grid (R × C) sends only 1/C of each projection's output around its R-rank columns, the "
               "rings that cross the slow links when tp spans nodes, where 1D all-reduces the whole hidden state "
               "over every tp rank; inside one node 1D moves less")},
           why=_why),
)
"""How a tp grid prints, reads and is explained (Note [an option is an entry], cost/options.py)."""


def _columns_and_rows(spec, layout, hw, tokens: float, size: float):
    """(seconds of one all-reduce over a column, over a row) as functions of the features moved."""
    rows, cols = layout.tp_grid

    def column(features: float) -> float:
        return collective_time(hw, "all_reduce", tokens * features * size, size=rows, stride=cols)

    def row(features: float) -> float:
        return collective_time(hw, "all_reduce", tokens * features * size, size=cols, stride=1)

    return column, row


def grid_block_comm(spec, layout, hw, *, tokens: float, size: float) -> tuple[float, float] | None:
    """(forward, backward) seconds of one block's 2D tp collectives on ``tokens`` tokens
    (Note [2D tp costs]); ``size``: bytes per activation element. None for 1D tp."""
    if layout.tp_shape is None:
        return None
    m = spec.model
    rows, cols = layout.tp_grid
    column, row = _columns_and_rows(spec, layout, hw, tokens, size)
    kv = m.kv_heads * m.head_dim
    colwise_out = [m.attention_width, kv, kv] + [m.ffn] * (2 if m.arch is Arch.LLAMA else 1)  # q, k, v; (gate,) up
    rowwise = 2  # o_proj, down_proj
    norm_sums = 2 * (1 if m.arch is Arch.LLAMA else 2)  # two norms' row statistics (fp32 scalars per token)
    statistics = norm_sums * collective_time(hw, "all_reduce", tokens * 4.0, size=rows, stride=cols)
    forward = sum(column(out / cols) for out in colwise_out) + rowwise * row(m.hidden / rows) + statistics
    backward = len(colwise_out) * row(m.hidden / rows) + sum(
        column(inner / cols) for inner in (m.attention_width, m.ffn)) + statistics
    return forward, backward


def grid_head_comm(spec, layout, hw, *, tokens: float, size: float) -> float | None:
    """Seconds of the embedding's sum over a row, the head's product over a column and its
    input gradient over a row, and the loss's three (tokens,) statistics over a row; None
    for 1D tp."""
    if layout.tp_shape is None:
        return None
    m = spec.model
    rows, cols = layout.tp_grid
    column, row = _columns_and_rows(spec, layout, hw, tokens, size)
    loss = 3 * collective_time(hw, "all_reduce", tokens * 4.0, size=cols, stride=1)
    return row(m.hidden / rows) + column(m.padded_vocab / cols) + row(m.hidden / rows) + loss
