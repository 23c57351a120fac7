"""The tests' reference side of Note [counter-based init] (runtime/models/param_init.py):
initial values generated on the CPU in plain steps, for the tests to compare the trainer's
path (``model.init_weights``: ``param_init.materialize_on``, ZeRO-3's ``fill_flat_``) with.
A build does not ship these; they use only param_init.py's ``fill_`` and ``boxes``.

Gives: ``init_values`` (any box of one parameter's initial value), ``full_init`` (the
whole value) and ``initialize`` (a model built on the CPU, filled in place).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from parc.runtime.models.param_init import boxes, fill_


def init_values(name: str, full_shape, *, layers: int, seed: int, offsets=None, shape=None,
                dtype=torch.float32, device=None) -> torch.Tensor:
    """The box ``offsets``/``shape`` (default: all) of parameter ``name``'s initial value."""
    shape = tuple(full_shape) if shape is None else tuple(shape)
    out = torch.empty(shape, dtype=dtype, device=device)
    return fill_(out, name, full_shape, layers=layers, seed=seed, offsets=offsets, shape=shape)


def full_init(name: str, shape, *, layers: int, seed: int) -> torch.Tensor:
    """The full (unsharded) initial value of parameter ``name``; layout-independent."""
    return init_values(name, shape, layers=layers, seed=seed)


@torch.no_grad()
def initialize(model: nn.Module, seed: int) -> None:
    """Set every parameter of ``model`` per Note [counter-based init]: each rank fills
    only the elements of its own shard."""
    layers = model.config.layers
    for module, attr, name, full, offsets in list(boxes(model)):
        param = getattr(module, attr)
        fill_(param, name, full, layers=layers, seed=seed, offsets=offsets, shape=tuple(param.shape))
