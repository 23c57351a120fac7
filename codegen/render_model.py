"""Rendering of train.py's model: the plain model, the layout's transforms, values, kernels.

Takes: a ``Plan`` and the tp group's and SP's expressions (``render.py`` names the
groups). Gives: ``model_lines``, the lines after ``config = model.ModelConfig(...)``:
``model.build_model`` (or ``build_stages``, a pipeline rank's chunks), then one line per
transform the layout uses in the order of ``runtime/layout/transforms.ORDER`` (Note [the
order of the transforms]): the tensor step's, then each ``features.Feature``'s
``step_lines`` at its ``step``, and a per-layer setting's ``parallelize.<its name>``
taking its constant (Note [a per-layer setting is an entry]); then
``model.init_weights`` and ``model.use_kernels``.
Before: ``render.py`` (groups). After: the template places the lines.
"""

from __future__ import annotations

from parc.runtime.layout.transforms import ORDER

from . import features, render_hetero, render_pipeline
from .plan import Plan
from .plan_text import cite
from .view import Call


def model_lines(plan: Plan, *, tp_arg: str, sp_arg: str, tp_extra: tuple[tuple[str, str], ...]) -> list:
    """``tp_extra``: the tensor step's further keyword arguments (render.py: a 2D grid)."""
    tensor = Call(target="net", callee="parallelize.tensor", args=("net", tp_arg, "TP_PLAN"),
                  kwargs=(("sequence_parallel", sp_arg), *tp_extra))
    lines = [
        "# The plain model on the meta device (shapes, no values), then this layout's",
        "# transforms, in their one order (Note [the order of the transforms] in",
        "# parc_runtime/layout/transforms.py)",
        *render_pipeline.build_items(plan),
    ]
    used = features.in_use(plan)
    for step in ORDER:  # Note [the order of the transforms]; a feature's entry says its step's lines
        if step == "tensor":  # every train.py: at tp = 1 it checks TP_PLAN and splits nothing
            lines += _tensor(plan, tensor)
        lines += [line for feature in used if feature.step == step for line in feature.step_lines(plan)]
        # a per-layer setting's step is parallelize.<its name> (Note [a per-layer setting is an entry])
        lines += [f"net = parallelize.{entry.name}(net, {entry.constant})"
                  for entry in plan.used_settings() if entry.name == step]
    zero3 = plan.train.zero.value == 3
    lines += [
        "# Each rank generates only its shard, element by element from (seed, name,",
        "# element index): each layout starts from the numbers one rank would.",
        *(["# ZeRO-3: the parameters stay on the meta device; the optimizer generates each",
           "# rank's slices of them"] if zero3 else []),
        Call(target="net", callee="model.init_weights", args=("net",), kwargs=(
            ("seed", "args.seed"), ("device", "dist.device"), *((("materialize", "False"),) if zero3 else ()))),
        "net = model.use_kernels(net, KERNELS, dist.device)",
    ]
    return lines


def _tensor(plan: Plan, tensor: Call) -> list:
    layouts = (("layouts", "layouts"),) if render_hetero.enabled(plan) else ()
    return [tensor.given(*layouts, comment=f"{cite(plan.mesh.axis('tp').span)}: layers split over tp as TP_PLAN says")]
