"""Rendering of the cluster scripts: ``launch.sh`` (torchrun) and ``slurm.sbatch``.

Takes: a ``Plan`` (its mesh: nodes, devices per node, device). Gives: the template
variables of ``templates/launch.sh.j2`` — one node with ``--standalone``, or many
with c10d rendezvous at ``HEAD_NODE:HEAD_PORT``; nnodes, node rank, head node and
``--max-restarts`` as arguments or environment — and of ``templates/slurm.sbatch.j2``
(one ``srun`` task per node running torchrun, the head node taken from the
allocation, SIGTERM before the time limit so the trainer saves, requeue resuming
from the latest checkpoint). Both rely on train.py resuming by itself after an
elastic restart (``runtime/checkpoints/checkpoint.py``).
Before: ``codegen/render.py`` calls these. After: the templates place the values.
"""

from __future__ import annotations

import re
import shlex

from .plan import Plan

MAX_RESTARTS = 3
"""torchrun restarts all ranks this many times after a failure (each resumes)."""
SIGTERM_LEAD_S = 180
"""Slurm sends SIGTERM this long before the time limit: the step in flight and a save fit
(torchrun itself gives its workers 30 s after it forwards SIGTERM, then kills them)."""


def launch_context(plan: Plan) -> dict:
    mesh = plan.mesh
    return dict(
        nodes=mesh.nodes,
        nproc=mesh.devices_per_node,
        max_restarts=MAX_RESTARTS,
        where="" if mesh.nodes == 1 else f", {mesh.devices_per_node} on each of {mesh.nodes} nodes",
    )


def slurm_context(plan: Plan) -> dict:
    mesh = plan.mesh
    gpus = mesh.device != "cpu"
    return dict(
        job_name=re.sub(r"[^A-Za-z0-9_.-]", "_", plan.model.name)[:64] or "parc",
        nodes=mesh.nodes,
        nproc=mesh.devices_per_node,
        device=mesh.device,
        gpu_lines=[f"#SBATCH --gpus-per-node={mesh.devices_per_node}"] if gpus else [],
        max_restarts=MAX_RESTARTS,
        sigterm_lead_s=SIGTERM_LEAD_S,
        # the spec's folder (shell-quoted: it is user text), or "checkpoints"
        checkpoint_dir=shlex.quote(plan.train.checkpoint_dir.value or "checkpoints"),
    )
