"""Context parallel in the cost model: what cp costs in communication and memory per kind.

Takes: a ``Spec``, a ``Layout`` with cp > 1 and ``Hardware``. Gives: ``cp_comm`` (one
block's cp exchange per micro-batch, forward and backward, and what of it compute
cannot hide) and ``cp_saved_elements`` (what a kind saves for backward beyond the
block's own T/cp tokens). Every other term of the model already follows cp: the time
and memory of a block are those of its ``micro_batch · seq_len / cp`` tokens
(``Layout.tokens``), so activations fall ∝ 1/cp, and gradients reduce over dp × cp.
Before: ``cost/layout.py``. After: ``cost/time.py``, ``cost/memory.py``.

Note [cp costs] (runtime/parallel/context/context.py, runtime/parallel/context/ring.py), per block and micro-batch, kv =
kv_heads·head_dim / tp (a rank's K or V width; one head when tp > kv_heads), q = heads·
head_dim / tp, n = T/cp local tokens, e bytes an element:
- ring: cp − 1 steps each pass a K/V block (2·n·kv·e) to the next rank, posted before
  the step's block attention, so only what exceeds the step's compute (1/cp of the
  core) shows; backward passes K/V and the partial dK/dV (fp32), hidden behind twice
  the core's work.
- ulysses: four all-to-alls (q, k, v out; the output back) of (2q + 2kv)·n·e, the same
  four in backward, on the critical path.
- allgather: K/V all-gathered (2·kv·T·e), backward reduce-scatters dK/dV; the gathered
  K/V (cp − 1 other ranks' tokens) stay saved for backward: that is its memory cost.
"""

from __future__ import annotations

from parc.dsl.spec import Spec

from .comm import collective_time
from .hardware import Hardware
from .layout import Layout
from .options import Option

OPTIONS = (
    Option(name="cp_kind", default="ring", axis="cp", words=lambda kind: kind,
           of_plan=lambda plan: plan.mesh.cp_kind.value, of_spec=lambda par: par.cp_kind,
           column=lambda layout: f"cp{layout.cp} {layout.cp_kind}" if layout.cp > 1 else None),
)
"""How the cp kind prints and reads (Note [an option is an entry], cost/options.py)."""


def eager_core(spec: Spec, layout: Layout) -> bool:
    """Ring attention under attention dropout runs the eager block reference (Note [ring
    attention with dropout] in runtime/parallel/context/ring.py): no flash rate, and its
    scores stream through memory (``time._block_forward``)."""
    return layout.cp > 1 and layout.cp_kind == "ring" and spec.model.dropout > 0


def _widths(spec: Spec, layout: Layout) -> tuple[float, float]:
    """(q, kv): a rank's query and K (or V) widths in elements per token."""
    m = spec.model
    D = m.head_dim
    kv_heads = max(1.0, m.kv_heads / layout.tp)  # tp > kv_heads: one replicated head
    return m.heads * D / layout.tp, kv_heads * D


def cp_comm(spec: Spec, layout: Layout, hw: Hardware, *, size: float, core: float) -> tuple[float, float, float]:
    """(forward exposed, backward exposed, total moved time) of one block's cp exchange for
    one micro-batch (Note [cp costs]); ``core``: the block's attention compute on this rank."""
    cp = layout.cp
    if cp == 1:
        return 0.0, 0.0, 0.0
    q, kv = _widths(spec, layout)
    local = layout.micro_batch * spec.model.seq_len / cp
    stride = layout.tp  # cp is next to tp in the rank order (runtime/layout/axes.py)
    if layout.cp_kind == "ring":
        step = collective_time(hw, "send_recv", 2 * local * kv * size, size=2, stride=stride)
        grad_step = collective_time(hw, "send_recv", 2 * local * kv * (size + 4.0), size=2, stride=stride)
        per_step_core = core / cp
        forward = (cp - 1) * max(0.0, step - per_step_core)
        backward = (cp - 1) * max(0.0, grad_step - 2 * per_step_core)
        return forward, backward, (cp - 1) * (step + grad_step)
    if layout.cp_kind == "ulysses":
        # an all-to-all moves (cp−1)/cp of each rank's buffer, as an all-gather's ring does
        each = collective_time(hw, "all_gather", (2 * q + 2 * kv) * local * size, size=cp, stride=stride)
        return each, each, 2 * each
    whole = 2 * kv * local * cp * size  # allgather: K and V of the whole sequence
    forward = collective_time(hw, "all_gather", whole, size=cp, stride=stride)
    backward = collective_time(hw, "reduce_scatter", whole, size=cp, stride=stride)
    return forward, backward, forward + backward


def cp_saved_elements(spec: Spec, layout: Layout) -> float:
    """Elements per local token one block saves beyond its own tokens' tensors: allgather
    keeps the other cp − 1 ranks' K and V for backward; ring and ulysses nothing more."""
    if layout.cp == 1 or layout.cp_kind != "allgather":
        return 0.0
    _, kv = _widths(spec, layout)
    return 2 * kv * (layout.cp - 1)
