"""Pass 3: the mesh axes, their order and sizes.

Takes: a buildable ``Spec``. Gives: ``draft.mesh`` with the axes in mesh order —
``pp`` outermost, then ``dp``, ``cp``, and ``tp`` innermost, so that the ranks of one tp
group are consecutive and share a node (tp talks on every layer; dp once a step).
Axes of size 1 stay in the mesh, so later axes slot in without renumbering ranks.
``cp_kind`` travels with the mesh (``MeshPlan.cp_kind``). The layout fills the mesh
exactly (dp · cp · tp · pp = nodes · devices_per_node) and a tp
group stays on one node: ``check_buildable`` held the spec to those rules
(``runtime/layout/constraints/``: ``world``, ``tp_within_node``).

Before: ``check_buildable``. After: ``partition_layers``. The ranks and groups follow
from the axes (``MeshPlan.ranks``, ``runtime/layout/axes.py``).
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec
from parc.runtime.layout.axes import NAMES

from ..plan import MeshAxis, MeshPlan, Setting
from .draft import Draft


def run(spec: Spec, draft: Draft) -> Draft:
    degrees = {name: getattr(spec.parallel, name) for name in NAMES}  # Note [adding an axis]
    axes = tuple(MeshAxis(axis=name, size=degrees[name], span=spec.span(f"parallel.{name}")) for name in NAMES)
    mesh = spec.mesh
    plan = MeshPlan(
        axes=axes,
        nodes=mesh.nodes,
        devices_per_node=mesh.devices_per_node,
        device=mesh.device,
        device_flops=float(mesh.device_flops) if mesh.device_flops is not None else _profile_flops(spec),
        device_flops_from_profile=spec.span("mesh.profile") if mesh.device_flops is None and _profile_flops(spec)
        else None,
        nodes_span=spec.span("mesh.nodes"),
        devices_span=spec.span("mesh.devices_per_node"),
        device_span=spec.span("mesh.device"),
        cp_kind=Setting(name="CP_KIND", value=spec.parallel.cp_kind, span=spec.span("parallel.cp_kind")),
        tp_shape=tp_shape(spec),
    )
    return replace(draft, mesh=plan)


def _profile_flops(spec: Spec) -> float | None:
    """The ``mesh.profile`` file's peak FLOP/s, for MFU; None without a readable one (a
    profile the planner must read and cannot is its error, PAR0804)."""
    from ..planner.cost.hardware import ProfileError, profile_peak_flops, read_profile

    if spec.mesh.profile is None:
        return None
    try:
        return profile_peak_flops(read_profile(spec.resolve(spec.mesh.profile)))
    except ProfileError:
        return None


def tp_shape(spec: Spec) -> Setting | None:
    """TP_SHAPE when the tp ranks form a 2D grid (R > 1); None for 1D (Note [2D tensor parallelism])."""
    shape = spec.parallel.tp_shape
    if shape is None or shape[0] == 1:
        return None
    return Setting(name="TP_SHAPE", value=tuple(shape), span=spec.span("parallel.tp_shape"))
