"""One layout, evaluated: memory and time together, and the figures a user compares.

Takes: a ``Spec``, a ``Layout``, ``Hardware`` and an ``Accounting``. Gives:
``Estimate`` (tokens/s, TFLOP/s per device, MFU, peak memory, whether it fits, the
two breakdowns, whether ``parc build`` can generate it) and ``estimate(...)``.
Before: ``cost/memory.py``, ``cost/time.py``. After: ``codegen/planner/search.py``,
``codegen/cli/plan.py``, ``codegen/passes/choose_layout.py``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from parc.dsl.spec import Spec
from parc.runtime.layout.constraints import BUILD, holds, reads, rules_of

from .hardware import Hardware
from .layout import Accounting, Layout
from .memo import shared
from .memory import MemoryBreakdown, MemoryEstimate, memory
from .per_layer import hetero_supported, hetero_time_memory
from .per_stage import pipeline_time_memory
from .time import TimeBreakdown, step_time

USABLE_MEMORY = 0.95
"""Fraction of a device's memory a layout may plan to use (allocator slack, workspaces)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    layout: Layout
    time: TimeBreakdown
    memory: MemoryBreakdown
    """The peak pipeline rank's."""
    peak_rank: int
    tokens_per_s: float
    tflops_per_device: float
    """Model FLOP/s (no recompute) per device, in TFLOP/s."""
    mfu: float
    fits: bool
    buildable: bool
    """``parc build`` can generate it (zero 3 is predicted, not built yet)."""

    @property
    def peak_mem_bytes(self) -> float:
        return self.memory.total


def buildable(spec: Spec, layout: Layout) -> bool:
    """``parc build`` can generate ``spec`` with ``layout``: no BUILD rule of
    ``runtime/layout/constraints/`` fails (zero 3 is predicted, not built yet). Each rule's
    verdict is shared by the layouts that agree on the fields it reads (Note [planner caches])."""
    values = []  # the layout's values, made on the first rule not yet decided for its fields

    def check(entry) -> bool:
        if not values:
            values.append(layout_values(spec, layout))
        return holds(values[0], entry)

    for entry, names in _build_rules():
        key = tuple(getattr(layout, name) for name in names)
        if not shared((spec,), f"buildable.{entry.name}", key, lambda: check(entry)):
            return False
    return True


@functools.cache
def _build_rules() -> tuple:
    """Each BUILD rule with the ``Layout`` fields it reads (a derived value's inputs: ``reads``;
    ``layer_dp``: dp, tp and layer_tp, its makings)."""
    out = []
    for entry in rules_of((BUILD,)):
        names = set(reads(entry))
        if "layer_dp" in names:
            names |= {"dp", "tp", "layer_tp"}
        out.append((entry, tuple(name for name in Layout.__slots__ if name in names)))
    return tuple(out)


def layout_values(spec: Spec, layout: Layout) -> dict:
    """``spec``'s values (``constraints.KEYS``) with ``layout`` written in, per-layer degrees too."""
    values = dict(_spec_values(spec))
    values.update((name, getattr(layout, name)) for name in Layout.__slots__ if name in values)
    values["layer_dp"] = layout.layer_dp
    return values


_LAST_VALUES: list = [None, None]
"""The last spec ``layout_values`` read and its values: the search asks for one spec's
thousands of times (held, so its ``id`` is not reused)."""


def _spec_values(spec: Spec) -> dict:
    from ...spec_values import spec_values  # codegen/spec_values.py imports nothing of cost/

    if _LAST_VALUES[0] is not spec:
        _LAST_VALUES[:] = [spec, spec_values(spec)]
    return _LAST_VALUES[1]


def _hetero(spec: Spec, layout: Layout, hw: Hardware, exact: bool = False):
    """A heterogeneous layout's time breakdown and memory: one stage's program, or the pipeline's."""
    if layout.pp > 1:
        return pipeline_time_memory(spec, layout, hw, exact=exact)
    return hetero_time_memory(spec, layout, hw)


def layout_memory(spec: Spec, layout: Layout, hw: Hardware, accounting: Accounting = Accounting.PARC) -> MemoryEstimate:
    """``memory(...)``, or for a heterogeneous layout the per-layer model's (Note [per-layer
    layout costs]; its coarse split where that model does not reach)."""
    if layout.layer_tp is not None and hetero_supported(spec, layout, accounting):
        return _hetero(spec, layout, hw)[1]
    return memory(spec, layout if layout.layer_tp is None else replace(layout, layer_tp=None), accounting)


def estimate(
    spec: Spec, layout: Layout, hw: Hardware, accounting: Accounting = Accounting.PARC, *, exact: bool = True
) -> Estimate:
    if layout.layer_tp is not None and hetero_supported(spec, layout, accounting):
        time, mem = _hetero(spec, layout, hw, exact)  # Note [per-layer layout costs]
    else:  # a heterogeneous layout the per-layer model does not cover: its coarse split
        coarse = layout if layout.layer_tp is None else replace(layout, layer_tp=None)
        time = step_time(spec, coarse, hw, accounting, exact=exact)
        mem = memory(spec, coarse, accounting)
    world = layout.dp * layout.cp * layout.tp * layout.pp
    achieved = time.model_flops / time.step / world
    limit = None if hw.memory is None else hw.memory * USABLE_MEMORY
    return Estimate(
        layout=layout,
        time=time,
        memory=mem.peak,
        peak_rank=mem.peak_rank,
        tokens_per_s=spec.train.global_batch * spec.model.seq_len / time.step,
        tflops_per_device=achieved / 1e12,
        mfu=achieved / hw.peak_flops,
        fits=limit is None or mem.peak.total <= limit,
        buildable=buildable(spec, layout),
    )
