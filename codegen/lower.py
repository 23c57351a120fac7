"""Lowering: a checked ``Spec`` → the ``Plan``, one named pass at a time.

Takes: a ``Spec`` from ``parc.dsl``. Gives: a frozen ``Plan`` or ``Diagnostics``
(each pass reports all of its problems before the next runs). The whole pipeline
is the list below; each pass is ``run(spec, draft) -> draft`` in its own module.
Before: ``parc.dsl.load``. After: ``codegen/render.py``.
"""

from __future__ import annotations

from parc import __version__
from parc.dsl.spec import Spec

from .errors import InternalError
from .passes import (
    check_buildable,
    check_values,
    choose_layout,
    lay_out_layers,
    partition_layers,
    place_sequence_parallel,
    plan_batches,
    resolve_mesh,
    split_pipeline,
    settle_training,
)
from .passes.draft import OPTIONAL, Draft
from .plan import Plan
from .plan_text import safe_file_name

PASSES = (
    check_values,
    choose_layout,
    check_buildable,
    resolve_mesh,
    partition_layers,
    place_sequence_parallel,
    plan_batches,
    split_pipeline,
    lay_out_layers,
    settle_training,
)


def source_name(spec: Spec) -> str:
    """The spec's base name: generated files cite it, never a path."""
    return safe_file_name(spec.source)


def lower(spec: Spec) -> Plan:
    draft = Draft()
    for stage in PASSES:
        draft = stage.run(spec, draft)
        spec = draft.spec or spec  # choose_layout's: the planner's layout in place of auto
    missing = [name for name in Draft.__slots__ if getattr(draft, name) is None and name not in OPTIONAL]
    if missing:
        raise InternalError("lower", f"no pass filled {', '.join(missing)}")
    return Plan(
        source=source_name(spec),
        parc_version=__version__,
        mesh=draft.mesh,
        tensor_parallel=draft.tensor_parallel,
        sequence_parallel=draft.sequence_parallel,
        pipeline=draft.pipeline,
        batch=draft.batch,
        model=draft.model,
        train=draft.train,
        layers=draft.layers,
        predicted=draft.predicted,
    )
