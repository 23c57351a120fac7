"""``--init-from CKPT`` (or the spec's ``train.init = checkpoint(dir)``): start from a checkpoint's weights.

Takes: the trainer's ``checkpoint.Checkpoints`` (this rank's model, optimizer and
layout), the path, and the step ``restore`` returned. Gives: ``init_from``, which reads
the weights — only the ``model.*`` tensors, through the same boxes and DCP load a
``--resume`` uses (``Checkpoints._model_pieces``, Note [logical checkpoint tensors]),
so any layout (tp, pp, cp, ep, ZeRO-3, per-layer lists) reads any checkpoint of the
model — and leaves the optimizer fresh, the step 1 and the RNG as the seed made it.
Unlike ``--resume``: no moments, no step, no data position. Before: ``Checkpoints.restore``
(a run that resumed, from ``--resume`` or after an elastic restart, does not re-init).
After: the training loop.

A checkpoint of another model is refused before anything is read, naming every tensor
that differs (missing here, missing there, or of another shape), with the model
settings that differ, in one line rank 0 prints (all ranks find the same).
"""

from __future__ import annotations

import os

from ..layout.model_desc import describe
from .checkpoint_files import CheckpointError, model_config, read_info, resolve

SHOWN = 6
"""Differing tensors named in the message (then a count of the rest)."""


def init_from(checkpoints, path: str | None, *, done: int) -> None:
    """Load the weights of checkpoint ``path`` (or a folder's latest) into ``checkpoints``' model."""
    if not path:
        return
    rank0 = checkpoints.rank == 0
    if done:  # resumed (--resume, or torchrun restarted us): the checkpoint's weights are newer
        if rank0:
            print(f"--init-from {path} not read: resumed at step {done}", flush=True)
        return
    try:
        path = resolve(path)
        info = read_info(path)
        _check_tensors(path, info, checkpoints.config)
        from . import checkpoint_dcp  # Note [DCP on demand] (checkpoint_dcp.py)

        pieces = checkpoints._model_pieces(saving=False)
        checkpoint_dcp.load(path, {}, pieces)
    except CheckpointError as exc:
        raise SystemExit(f"train.py: --init-from {exc}" if rank0 else 1) from None
    checkpoints.boxes.loaded(checkpoints.optimizer)  # bf16/fp16: the fp32 masters rounded into the weights
    if rank0:
        print(f"initialized from {os.path.normpath(path)} ({info['layout']}, step {info['step']}): "
              "its weights, a fresh optimizer, step 1", flush=True)


def expected_shapes(config) -> dict[str, tuple[int, ...]]:
    """The full shape of every tensor a checkpoint of model ``config`` holds, as ``model.<name>``."""
    return {f"model.{m.name}.{p.name}": tuple(p.shape) for m in describe(config).modules if m.tied_to is None
            for p in m.params}


def _check_tensors(path: str, info: dict, config) -> None:
    """The checkpoint's model tensors are this model's, by name and full shape, or a ``CheckpointError``."""
    from . import checkpoint_dcp
    from .checkpoint import _config_difference

    saved = {name: shape for name, shape in checkpoint_dcp.tensor_shapes(path).items() if name.startswith("model.")}
    ours = expected_shapes(config)
    differ = [f"{name[6:]} {list(saved[name])} there, {list(ours[name])} here"
              for name in sorted(set(saved) & set(ours)) if saved[name] != ours[name]]
    differ += [f"{name[6:]} missing there" for name in sorted(set(ours) - set(saved))]
    differ += [f"{name[6:]} not in this model" for name in sorted(set(saved) - set(ours))]
    if not differ:
        return
    more = f"; and {len(differ) - SHOWN} more" if len(differ) > SHOWN else ""
    settings = _config_difference(model_config(info, path), config)
    raise CheckpointError(
        f"{path} is a checkpoint of another model{settings}: {'; '.join(differ[:SHOWN])}{more}"
    )
