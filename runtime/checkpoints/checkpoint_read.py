"""A checkpoint read whole, in one process: ``parc export``'s side (and the tests').

Takes: a checkpoint folder (a step folder, or a run's folder: its latest step). Gives:
``read_full(path, prefix)``, every tensor whose name starts with ``prefix`` at its full
shape, through DCP and ``checkpoint_dcp.CheckedReader`` (Note [a checkpoint is untrusted
input]). The trainer reads only its own boxes (``checkpoint.Checkpoints``), so a build
does not ship this module.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from .checkpoint_dcp import CheckedReader, _load
from .checkpoint_files import resolve


def read_full(path: str, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of checkpoint ``path`` whose name starts with ``prefix``, whole (one process).

    Raises ``CheckpointError`` for a folder that is not a readable checkpoint.
    """
    path = resolve(path)
    saved = CheckedReader(path).read_metadata().state_dict_metadata
    state = {
        name: torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for name, md in sorted(saved.items())
        if name.startswith(prefix) and isinstance(md, TensorStorageMetadata)
    }
    _load(path, state, DefaultLoadPlanner(flatten_state_dict=False))
    return state
