"""Pass 3: the mesh axes, their order and sizes.

Takes: a buildable ``Spec``. Gives: ``draft.mesh`` with the axes in mesh order —
``pp`` outermost, then ``dp``, then ``tp`` innermost, so that the ranks of one tp
group are consecutive and share a node (tp talks on every layer; dp once a step).
Axes of size 1 stay in the mesh, so later axes slot in without renumbering ranks.
The layout fills the mesh exactly (dp · tp · pp = nodes · devices_per_node) and a tp
group stays on one node: ``check_buildable`` held the spec to those rules
(``runtime/constraints.py``: ``world``, ``tp_within_node``).

Before: ``check_buildable``. After: ``assign_ranks`` (fills ranks and groups).
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec

from ..plan import Axis, MeshAxis, MeshPlan
from .draft import Draft

MESH_ORDER = (Axis.PP, Axis.DP, Axis.TP)


def run(spec: Spec, draft: Draft) -> Draft:
    degrees = {Axis.PP: spec.parallel.pp, Axis.DP: spec.parallel.dp, Axis.TP: spec.parallel.tp}
    axes = tuple(
        MeshAxis(axis=axis, size=degrees[axis], span=spec.span(f"parallel.{axis.value}"))
        for axis in MESH_ORDER
    )
    mesh = spec.mesh
    plan = MeshPlan(
        axes=axes,
        nodes=mesh.nodes,
        devices_per_node=mesh.devices_per_node,
        device=mesh.device,
        device_flops=float(mesh.device_flops) if mesh.device_flops is not None else None,
        ranks=(),
        groups=(),
        nodes_span=spec.span("mesh.nodes"),
        devices_span=spec.span("mesh.devices_per_node"),
        device_span=spec.span("mesh.device"),
    )
    return replace(draft, mesh=plan)
