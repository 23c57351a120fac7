"""The layout in words: one description for ``train.py``'s docstring, the run banner, the
launch scripts, ``parc verify`` and ``parc explain``.

Takes: the degrees and options of a layout as plain values (``Words``), from a ``Plan``
(``of_plan``) or from the planner's ``Layout`` (``of_layout``: ``parc explain`` reads the
spec's own or the planner's). Gives: ``words(w)``, e.g. ``pp 2 × dp 2 × cp 2 (ring) × tp 4
(2×2) + ep 2 + sequence parallel + ZeRO-1 + interleaved(2) + recompute selective``: the
world's axes that are split, in the mesh's order (``runtime/layout/axes.py``), then every
option that is not its default; a per-layer setting in its registry's words
(``layer_settings.shown``: ``recompute selective``, ``[full ×3, none ×93]``).
Before: nothing. After: ``render.py``, ``verify.py``, ``cli/explain.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parc.runtime.layout.axes import WORLD_ORDER
from parc.runtime.schedules.schedule import SLICED
from parc.runtime.layout.layer_settings import SETTINGS, fold_runs, shown


@dataclass(frozen=True, slots=True, kw_only=True)
class Words:
    degrees: dict
    """Each world axis's degree (``dp``, ``cp``, ``tp``, ``pp``)."""
    options: dict = field(default_factory=dict)
    """Each layout option's value, by its entry's name (``planner/cost/options.py``); absent: its default."""
    per_layer: str | None = None
    """Per-layer tp × dp in words (``per_layer_words``); replaces dp and tp."""
    ep: int = 1
    sp: bool = False
    zero: int = 0
    schedule: str | None = None
    """The pipeline schedule in the language's words (pp > 1 only)."""
    settings: dict | None = None
    """Each per-layer setting's value (``layer_settings.SETTINGS``): one, or a tuple of one per block."""
    compress: str = "none"


def words(w: Words) -> str:
    """The layout in words; each option's from its entry (Note [an option is an entry])."""
    from .planner.cost.options import options

    said = {entry.name: entry.words(w.options.get(entry.name, entry.default)) for entry in options()}
    parts = []
    for axis in sorted(w.degrees, key=_mesh_order):
        size = w.degrees[axis]
        if size <= 1 or (w.per_layer and axis in ("dp", "tp")):
            continue
        extra = "".join(f" ({said[entry.name]})" for entry in options()
                        if entry.axis == axis and said[entry.name] is not None)
        parts.append(f"{axis} {size}{extra}")
    if w.per_layer:
        parts.append(w.per_layer)
    text = " × ".join(parts) if parts else "one rank"
    extras = [f"ep {w.ep}" if w.ep > 1 else "", *(said[entry.name] or "" for entry in options() if not entry.axis),
              "sequence parallel" if w.sp else "", f"ZeRO-{w.zero}" if w.zero else "", w.schedule or "",
              *(shown(entry, _one(w.settings[entry.name]), f"{entry.name} ") or ""
                for entry in SETTINGS if entry.name in (w.settings or {})),
              f"compress {w.compress}" if w.compress != "none" else ""]
    return " + ".join([text, *(extra for extra in extras if extra)])


def _mesh_order(axis: str) -> int:
    """pp outermost in words, as the mesh nests it: pp, then dp, cp, tp."""
    order = ("pp",) + tuple(a for a in WORLD_ORDER if a != "pp")
    return order.index(axis) if axis in order else len(order)


def _one(value):
    """A per-block tuple whose blocks agree as its one value."""
    return value[0] if isinstance(value, tuple) and len(set(value)) == 1 else value


def of_layout(layout) -> Words:
    """The planner's ``Layout`` (codegen/planner/cost/layout.py) in words' terms."""
    from .planner.cost.options import options

    return Words(
        degrees={"dp": layout.dp, "cp": layout.cp, "tp": layout.tp, "pp": layout.pp},
        options={entry.name: getattr(layout, entry.name) for entry in options()}, ep=layout.ep, sp=layout.sp,
        zero=layout.zero,
        schedule=schedule_words(layout.schedule, layout.chunks, layout.slices) if layout.pp > 1 else None,
        settings={entry.name: layout.setting(entry.name) for entry in SETTINGS}, compress=layout.compress,
        per_layer=None if layout.layer_tp is None else per_layer_words(zip(layout.layer_tp, layout.layer_dp)),
    )


def of_plan(plan) -> Words:
    """A build's ``Plan`` (codegen/plan.py) in words' terms."""
    from . import render_compress, render_hetero
    from .planner.cost.options import options

    mesh, pipe, hetero = plan.mesh, plan.pipeline, render_hetero.enabled(plan)
    ep = plan.model.expert_parallel
    compress = render_compress.kind(plan)
    return Words(
        degrees={a.axis: a.size for a in mesh.axes}, options={entry.name: entry.of_plan(plan) for entry in options()},
        per_layer=per_layer_words((b.tp, b.dp) for b in plan.blocks) if hetero else None,
        ep=ep.value if ep is not None else 1,
        sp=plan.sequence_parallel.enabled, zero=plan.train.zero.value,
        schedule=schedule_words(pipe.schedule, pipe.chunks, pipe.slices) if pipe.size > 1 else None,
        settings={entry.name: plan.per_block(entry.name) for entry in SETTINGS}, compress=compress,
    )


def schedule_words(kind: str, chunks: int, slices: int) -> str:
    """The schedule in the language's words: ``interleaved(2)``, a sliced kind with its
    slices (``schedule.SLICED``: ``kind(4)``), else the kind alone."""
    if kind == "interleaved":
        return f"interleaved({chunks})"
    return f"{kind}({slices})" if kind in SLICED else kind


def per_layer_words(blocks) -> str:
    """``tp 2 × dp 1 (layers.0-1), tp 1 × dp 2 (layers.2-3)``: the blocks' (tp, dp), runs folded."""
    words, index = [], 0
    for (tp, dp), n in fold_runs(list(blocks)):
        names = f"layers.{index}" if n == 1 else f"layers.{index}-{index + n - 1}"
        words.append(f"tp {tp} × dp {dp} ({names})")
        index += n
    return ", ".join(words)
