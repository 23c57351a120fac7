"""The model of a build: the plain decoder, its values, its kernels.

Takes: a ``ModelConfig`` (re-exported for train.py). Gives: ``build_model`` (the plain
model, or with ``build_stages`` a pipeline rank's chunks, on the meta device:
pipeline_stages.py, shipped with pipelines),
``init_weights`` (each rank generates its shard, Note [counter-based init] in
param_init.py, after ``parallelize``'s transforms made the layout), ``use_kernels`` and,
under sp, ``allreduce_sequence_parallel_grads`` (sp_columns.py's, shipped with sp).
train.py calls them in this order::

    net = model.build_model(config)                      # plain, one device, meta
    net = parallelize.tensor(net, tp_group, TP_PLAN, ...) # … the layout's transforms
    net = model.init_weights(net, seed=..., device=...)
    net = model.use_kernels(net, KERNELS, device)

Each stage is checked against the model description (``model_desc.py``: modules,
shapes, per-rank counts; ``check_parameter_count``) before it gets values.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..kernels import select as select_kernels
from ..kernels.dispatch import compiled_pays
from ..layout.kernel_sizes import kinds_that_pay
from ..layout.model_desc import ModelConfig, describe  # noqa: F401  (ModelConfig: re-exported for train.py)
from .attention import Attention
from .mlp import MLP
from .norm import Norm
from .param_init import materialize_on
from .parallelize import stages as stages_of
from .transformer import Transformer, check_parameter_count
from ..layout.roles import assign


def build_model(config) -> Transformer:
    """The plain model, whole, on the meta device: parameters with shapes, no values."""
    with torch.device("meta"):
        return Transformer(config)


def __getattr__(name: str):
    """``model.build_stages``, a pipeline rank's chunks: pipeline_stages.py's, which only a
    pipeline build ships, imported when first asked for (as Note [data by feature] in
    train/data.py), so train.py names it here as it names ``build_model``; so too
    ``model.allreduce_sequence_parallel_grads``, sp_columns.py's (only a build under sp
    ships it)."""
    if name == "build_stages":
        from .pipeline_stages import build_stages

        return build_stages
    if name == "allreduce_sequence_parallel_grads":
        from ..parallel.tensor.sp_columns import allreduce_sequence_parallel_grads

        return allreduce_sequence_parallel_grads
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def init_weights(net, *, seed: int, device, materialize: bool = True, init_on_device=None):
    """Values for every stage of ``net`` after its transforms, per Note [counter-based
    init]: each rank generates only its shard, on ``device`` itself where
    ``_generate_on`` says so, else on the CPU and then moved. ``materialize=False``
    (ZeRO-3): the parameters stay on the meta device, without values, until
    ``fsdp.FullyShardedAdamW`` generates each rank's slice of them; the seed and device
    are kept for it. Gives ``net``."""
    for stage in stages_of(net):
        check_parameter_count(stage)
        made = [name for name, p in stage.named_parameters() if not p.is_meta]
        if made:  # generated where they live below, or they would keep whatever memory held
            raise RuntimeError(f"internal error in parc (runtime model): {made[0]} has values before "
                               "init_weights; a transform must make parameters on the meta device")
        if getattr(stage, "replica", None) is not None:  # Note [stage replicas] (pipeline_stages.py)
            for param in stage.parameters():
                assign(param, pipeline_replica=True)
                if stage.replica == 1:  # the up pipeline's copy (a tied head copy stays one either way)
                    assign(param, pipeline_duplicate=True)
        _check_meta_attributes(stage)
        if not materialize:
            stage.init_seed, stage.init_device = seed, torch.device(device)
            continue
        on_device = _generate_on(device, init_on_device)
        materialize_on(stage, seed, device if on_device else "cpu")
        stage.to(device)
    return net


def _generate_on(device, init_on_device) -> bool:
    """Generate the initial values on ``device`` itself (param_init.materialize_on): by
    default on CUDA; ``init_on_device`` forces it either way (the CPU tests run it)."""
    return torch.device(device).type == "cuda" if init_on_device is None else bool(init_on_device)


def _check_meta_attributes(model) -> None:
    for module in model.modules():  # only parameters may wait on the meta device for their values
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and value.is_meta:
                raise RuntimeError(f"internal error in parc (runtime model): {type(module).__name__}.{attr} "
                                   "was built on the meta device; make it on its device")


def use_kernels(model: nn.Module, kernels: str, device, fuse_residual: bool = True) -> nn.Module:
    """Route the norms, MLP activations, rotary, loss and the experts' permutation, combine
    and grouped GEMM (moe.py) to ``kernels``: "compiled" or "eager".

    "compiled" uses runtime/kernels' fused ops for ``device`` (C++ on CPU, Triton on
    CUDA) unless they cannot be had, in which case one line on stderr says so and the
    model stays eager; each residual add then runs inside the norm after it
    (``Norm.add_norm``) unless ``fuse_residual`` is False (a test compares the two).
    The norms, the residual norms, the activation and rotary each take the kernels only
    where they beat eager PyTorch at the model's size, chosen once here from its global
    shapes (Note [eager at small shapes] in kernels/dispatch.py). "eager" keeps plain
    PyTorch.
    """
    fused = select_kernels(kernels, device)
    config = next((m.config for m in model.modules() if isinstance(m, Transformer)), None)

    # the kinds that pay at this model's global size (kernel_sizes.py: the planner reads the same)
    taken = None if config is None else kinds_that_pay(config, cpu=torch.device(device).type == "cpu")

    def paying(kind, width=None):  # the ops if they pay at this model's size, else None (eager)
        if fused is None or config is None:
            return fused
        if width is None:
            return fused if kind in taken else None
        return fused if compiled_pays(kind, config.seq_len * width, device) else None

    for module in model.modules():
        if isinstance(module, Norm):
            norm = "rms_norm" if module.rms else "layer_norm"
            module.fused = paying(norm)
            module.fused_add = paying(f"add_{norm}") if fuse_residual else None
        elif isinstance(module, MLP):  # a dense MLP, or the shared experts (shared_experts · expert_ffn wide)
            module.fused = paying("swiglu" if module.llama else "bias_gelu", module.width)
        elif isinstance(module, Attention) and module.context is None:  # ring attention keeps its kernel
            module.fused = paying("rotary")
        # moe.py's modules say so themselves (a dense build does not ship moe.py)
        elif isinstance(module, (Attention, Transformer)) or getattr(module, "uses_kernels", False):
            module.fused = fused
    return model
