"""Pass 3: the mesh axes, their order and sizes.

Takes: a buildable ``Spec``. Gives: ``draft.mesh`` with the axes in mesh order —
``pp`` outermost, then ``dp``, ``cp``, and ``tp`` innermost, so that the ranks of one tp
group are consecutive and share a node (tp talks on every layer; dp once a step).
Axes of size 1 stay in the mesh, so later axes slot in without renumbering ranks.
The mesh carries the settings of how its axes work (``MeshPlan``'s ``cited`` fields,
the kind of attention over cp and the grid of tp). The layout fills the mesh
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

from ..plan import MeshAxis, MeshPlan, from_spec
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
        **from_spec(MeshPlan, spec),  # the settings the mesh carries (plan.py's ``cited`` fields)
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

