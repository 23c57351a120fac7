"""Pass 1b: the planner fills the layout values the spec left ``auto``.

Takes: a ``Spec`` whose values passed ``check_values``. Gives: the draft unchanged when
the spec gives its whole layout; else ``draft.spec``, the spec with the winner of the
search (``codegen/planner/search.py``: fits in memory, buildable, best predicted throughput)
in place of every ``auto`` (their spans: the ``auto`` they replace, marked
``planned``), and ``draft.predicted``, what the cost model predicts for
it (it lands in plan.json). Keys the spec fixed (or ``--set``) stay as given.
Diagnostics: no valid layout, or none that fits and ``parc build`` can generate.

Before: ``check_values``. After: ``check_buildable`` (and every later pass reads ``draft.spec``).
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.diagnostics import ParcError, Severity
from parc.dsl.spec import Spec
from parc.runtime.layout.layer_settings import SETTINGS
from parc.runtime.layout.layouts import no_layout

from ..planner.cost import Accounting, estimate, hardware_for
from ..planner.cost.estimate import USABLE_MEMORY
from ..planner.cost.hardware import ProfileError
from ..planner.cost.options import options
from ..errors import AUTO, MEMORY, check, error, profile_error
from ..plan import PredictionPlan
from ..planner.search import fixed_layout, search, with_layout
from ..spec_values import spec_values
from .draft import Draft


def _round(value: float) -> float:
    """Six significant digits: plan.json stays readable and stable."""
    return float(f"{value:.6g}")


def run(spec: Spec, draft: Draft) -> Draft:
    if spec.layout_complete:
        return draft
    try:
        hardware = hardware_for(spec)
    except ProfileError as exc:
        check([profile_error(spec, exc)])
    result = search(spec, hardware, Accounting.PARC)
    winner = result.winner
    if winner is None:
        missing = no_layout(spec_values(spec))
        if missing is not None:  # parc check refuses these already (dsl/checks.py)
            message, hint = missing.message, missing.hint
        else:
            smallest = min(result.estimates, key=lambda item: item.memory.total)
            message = (
                f"no layout that parc build can generate fits in memory: the smallest of "
                f"{result.considered} needs {smallest.memory.total / 2**30:.1f} GiB per rank, over the usable "
                f"{hardware.memory * USABLE_MEMORY / 2**30:.1f} GiB ({USABLE_MEMORY:.0%} of the device's "
                f"{hardware.memory / 2**30:.1f} GiB: allocator and runtime headroom)"
            )
            hint = ("run parc plan to see the candidates; lower micro_batch or use more devices; or write "
                    "the whole layout, which builds whatever the prediction says")
        check([error(spec, _first_auto(spec), AUTO, message, hint)])
    time, mem = winner.time, winner.memory
    predicted = PredictionPlan(
        layouts_considered=result.considered,
        accounting=Accounting.PARC.value,
        step_time_s=_round(time.step),
        tokens_per_s=_round(winner.tokens_per_s),
        tflops_per_device=_round(winner.tflops_per_device),
        mfu=_round(winner.mfu),
        compute_s=_round(time.compute),
        exposed_comm_s=_round(time.exposed_comm),
        bubble_s=_round(time.bubble),
        peak_mem_bytes=_round(mem.total),
        params_bytes=_round(mem.params),
        grads_bytes=_round(mem.grads),
        optimizer_bytes=_round(mem.optimizer),
        activations_bytes=_round(mem.activations),
        buffers_bytes=_round(mem.buffers),
    )
    chosen = with_layout(spec, winner.layout)
    return replace(draft, spec=replace(chosen, spans=_planned_spans(spec)), predicted=predicted)


LAYOUT_KEYS = ("dp", "tp", "pp", "cp", "ep")
"""The degrees a spec may leave ``auto`` (then the planner's options, sp, zero, the schedule and compression)."""


def _unset(name: str):
    return lambda spec: getattr(spec.parallel, name) is None


PLANNED_KEYS = {
    **{f"parallel.{name}": _unset(name) for name in LAYOUT_KEYS},
    **{f"parallel.{entry.name}": (lambda auto: lambda spec: auto(spec.parallel))(entry.auto)
       for entry in options() if entry.auto is not None},  # the options that may be left auto
    **{f"parallel.{name}": _unset(name) for name in ("sp", "zero", "schedule", "compress")},
    **{entry.key: _unset(entry.name) for entry in SETTINGS},
    "train.micro_batch": lambda spec: spec.train.micro_batch is None,
}
"""The keys the planner may fill, each with whether ``spec`` left it ``auto``: the degrees,
the planner's options that can be (``Option.auto``), sp, zero, the schedule, compression,
the per-layer settings and the micro-batch."""


def memory_warnings(spec: Spec) -> list[ParcError]:
    """PAR0808 (a warning): the layout the spec writes whole is predicted over the usable
    memory (``USABLE_MEMORY`` of the device's). It still builds: the prediction can be wrong
    and the user chose this layout; the planner only refuses layouts it picks itself."""
    layout = fixed_layout(spec)
    if layout is None:
        return []
    try:
        hardware = hardware_for(spec)
    except ProfileError:
        return []  # check_values reports the profile
    if hardware.memory is None:
        return []
    peak = estimate(spec, layout, hardware, Accounting.PARC).memory.total
    usable = hardware.memory * USABLE_MEMORY
    if peak <= usable:
        return []
    return [replace(error(
        spec, "parallel", MEMORY,
        f"this layout is predicted to need {peak / 2**30:.1f} GiB per rank, over the usable {usable / 2**30:.1f} "
        f"GiB ({USABLE_MEMORY:.0%} of the device's {hardware.memory / 2**30:.1f} GiB); built anyway, as written",
        "parc plan --set the same values shows where the memory goes; lower micro_batch, add zero, recompute "
        "or tp/pp ranks, or leave keys auto for the planner to fit",
    ), severity=Severity.WARNING)]


def _first_auto(spec: Spec) -> str:
    """The first key the planner would fill (its ``auto`` is what the error points at)."""
    unset = [key for key, left in PLANNED_KEYS.items() if left(spec)]
    written = [key for key in unset if spec.span(key) is not None]
    return (written or unset or ["parallel"])[0]


def _planned_spans(spec: Spec) -> tuple:
    """``spec.spans`` with every key the planner filled pointing at its ``auto`` (the
    key's own, else ``parallel = auto``), marked ``planned`` so the trainer cites it."""
    spans = dict(spec.spans)
    for key, left in PLANNED_KEYS.items():
        if not left(spec):
            continue
        where = spans.get(key) or spans.get(key.split(".")[0])
        if where is not None:
            spans[key] = replace(where, planned=True)
    return tuple(sorted(spans.items()))
