"""Pass 3: the mesh axes, their order and sizes.

Takes: a buildable ``Spec``. Gives: ``draft.mesh`` with the axes in mesh order —
``pp`` outermost, then ``dp``, then ``tp`` innermost, so that the ranks of one tp
group are consecutive and share a node (tp talks on every layer; dp once a step).
Axes of size 1 stay in the mesh, so later axes slot in without renumbering ranks.
The layout must fill the mesh exactly: dp · tp · pp = nodes · devices_per_node.

Before: ``check_buildable``. After: ``partition_layers``. The ranks and groups follow
from the axes (``MeshPlan.ranks``, ``runtime/axes.py``).
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec

from ..errors import MESH_MISMATCH, NOT_DIVISIBLE, check, error
from parc.runtime.axes import NAMES

from ..plan import MeshAxis, MeshPlan
from .draft import Draft


def run(spec: Spec, draft: Draft) -> Draft:
    degrees = {name: getattr(spec.parallel, name) for name in NAMES}  # Note [adding an axis]
    axes = tuple(MeshAxis(axis=name, size=degrees[name], span=spec.span(f"parallel.{name}")) for name in NAMES)
    mesh = spec.mesh
    world = mesh.nodes * mesh.devices_per_node
    layout = degrees["dp"] * degrees["tp"] * degrees["pp"]
    problems = []
    if layout != world:
        problems.append(
            error(
                spec,
                "parallel",
                MESH_MISMATCH,
                f"the layout needs dp · tp · pp = {degrees['dp']} · {degrees['tp']} · "
                f"{degrees['pp']} = {layout} ranks but the mesh has nodes · devices_per_node "
                f"= {mesh.nodes} · {mesh.devices_per_node} = {world}",
                f"change the degrees, or the mesh: --set mesh.devices_per_node={layout // mesh.nodes}"
                if layout % mesh.nodes == 0
                else "change the degrees or the mesh so that both products agree",
            )
        )
    elif mesh.nodes > 1 and mesh.devices_per_node % degrees["tp"] != 0:
        problems.append(
            error(
                spec,
                "parallel.tp",
                NOT_DIVISIBLE,
                f"tp = {degrees['tp']} does not divide devices_per_node = {mesh.devices_per_node}, "
                "so a tp group would span nodes",
                "keep each tp group on one node: tp must divide devices_per_node",
            )
        )
    check(problems)
    plan = MeshPlan(
        axes=axes,
        nodes=mesh.nodes,
        devices_per_node=mesh.devices_per_node,
        device=mesh.device,
        device_flops=float(mesh.device_flops) if mesh.device_flops is not None else None,
        nodes_span=spec.span("mesh.nodes"),
        devices_span=spec.span("mesh.devices_per_node"),
        device_span=spec.span("mesh.device"),
    )
    return replace(draft, mesh=plan)
