"""The transforms that make a layout of the plain model, one line each in train.py.

Takes: the plain model of ``model.build_model`` / ``build_stages`` (on the meta device,
no values yet) and each transform's own groups and settings. Gives: ``tensor``,
``context``, ``experts``, ``recompute`` and ``overlap``, each changing the model in place
and giving it back; they run in ``ORDER`` (Note [the order of the transforms] in
runtime/layout/transforms.py) and each refuses to run out of it. Each axis's work lives
beside the axis (``parallel/tensor/sharding.py``, ``parallel/context/context.py``,
``parallel/expert/moe.py``) and is imported only when its step runs, so a build ships
only the axes it uses; so too the steps after ``tensor``, which only some layouts run:
their work on each stage is parallelize_steps.py's, given here by name (``__getattr__``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from ..layout.transforms import ORDER


def stages(net) -> tuple:
    """The ``Transformer`` stages of ``net``: itself, or a pipeline rank's chunks."""
    return tuple(net) if isinstance(net, nn.ModuleList) else (net,)


@contextlib.contextmanager
def _step(net, name: str):
    """Record step ``name`` on every stage; refuse it after itself or a later step. The
    step runs on the meta device: what it makes has shapes, no values, until init_weights."""
    for stage in stages(net):
        done = stage.transforms
        if done and ORDER.index(done[-1]) >= ORDER.index(name):
            raise ValueError(f"parallelize.{name} after parallelize.{done[-1]}: the transforms run in the order "
                             f"{', '.join(ORDER)}, each at most once (Note [the order of the transforms])")
        if any(p.device.type != "meta" for p in stage.parameters()):
            raise ValueError(f"parallelize.{name} on a model with values: transform the plain model of "
                             "build_model before init_weights")
        stage.transforms = done + (name,)
    with torch.device("meta"):
        yield


def tensor(net, tp_group, tp_plan, *, sequence_parallel, grid=None, layouts=None):
    """Split the layers over tp as the ``tp_plan`` table says (``sharding.shard``): 1D,
    on a 2D ``grid`` (Note [2D tensor parallelism]), or each block at its own degree
    (``layouts``, Note [heterogeneous layouts]). At tp = 1 it checks the table and keeps
    every layer whole."""
    from ..parallel.tensor.sharding import shard

    with _step(net, "tensor"):
        return shard(net, tp_group, tp_plan, sequence_parallel=sequence_parallel, grid=grid, layouts=layouts)


def __getattr__(name: str):
    """``parallelize.context``, ``experts``, ``recompute`` and ``overlap``: each runs its work
    (parallelize_steps.py's, shipped only with a build whose train.py runs one of them:
    ``features.runtime_modules``) on every stage inside its step, as ``tensor`` does."""
    if name not in ORDER or name == "tensor":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import parallelize_steps

    work = getattr(parallelize_steps, name)

    def step(net, *args, **kwargs):
        with _step(net, name):
            work(stages(net), *args, **kwargs)
            return net

    step.__name__, step.__doc__ = name, work.__doc__
    return step
