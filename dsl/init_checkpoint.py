"""What ``parc check`` can tell of ``train.init = checkpoint(dir)`` before the run.

Takes: a checked ``Spec``. Gives: ``warnings(spec)``: PAR0224 (a warning, Note
[warnings] in ``dsl/diagnostics.py``) at ``train.init`` when its path, relative to the
spec's folder (``Spec.resolve``), holds no checkpoint: nothing there, or a folder with
neither a ``parc.json`` nor ``step_*`` checkpoints in it. A warning, not an error: the
checkpoint may be made before the run (``parc import``, another run), and the trainer
checks it whole at startup (runtime/checkpoints/checkpoint_init.py: it refuses one of another
model naming the tensors). Before: ``validate``. After: the command prints it.
"""

from __future__ import annotations

import os

from .diagnostics import ParcError, Severity
from .spec import Spec


def _holds_checkpoints(path: str) -> bool:
    if os.path.isfile(os.path.join(path, "parc.json")):
        return True
    return any(name.startswith("step_") for name in os.listdir(path))


def warnings(spec: Spec) -> list[ParcError]:
    written, span = spec.train.init_from, spec.span("train.init")
    if written is None or span is None:
        return []
    path = spec.resolve(written)
    if os.path.isdir(path) and _holds_checkpoints(path):
        return []
    what = "no checkpoint" if os.path.isdir(path) else "nothing"
    return [ParcError(
        span=span, code="PAR0224", severity=Severity.WARNING,
        message=f"{what} at {path} (a folder with parc.json, or step_* checkpoints)",
        hint="paths in a spec are relative to the spec's folder; make it before the run (parc import, "
        "or another run's --checkpoint-dir) or fix the path",
    )]
