"""Low-precision compute weights with fp32 master weights (``train.precision = bf16 | fp16``).

Takes: the model (or a pipeline rank's chunks) built and initialized in fp32, the
compute dtype and AdamW's hyper-parameters. Gives: ``to_compute_dtype`` (the model's
parameters cast in place, the fp32 values returned) and ``MasterAdamW``, the
optimizer of ``zero = 0`` under bf16/fp16: used like ``zero.ShardedAdamW`` — after
backward (and dp.py's bucket reduction) ``unscale_and_clip(max_norm, ...)`` returns the
global gradient norm, then ``step()`` and ``zero_grad()``. ZeRO keeps its own fp32
shards (zero.py, fsdp.py) and uses only ``to_compute_dtype`` / ``compute_dtype_of``.

Note [master weights]: the model's parameters are held in the compute dtype and used
as they are (no autocast copies: one bf16 copy of the weights, not one per use per
micro-batch). The optimizer keeps the fp32 master copy of every parameter and its
Adam moments; after each step the master values, rounded to the compute dtype, are
written back into the parameters. Gradients arrive in the compute dtype, are summed
over dp per ``train.grad_reduce`` (fp32: dp.py converts each bucket and divides in
fp32; with several backwards a step it sums the step's fp32 sum and the mean stays fp32,
Note [fp32 accumulation]), then copied to fp32 and there unscaled (fp16's loss scale) and
clipped: the optimizer's arithmetic is all fp32. Kept in fp32 whatever the compute
dtype: the norms' statistics and the softmax of attention (the kernels compute low-
precision inputs in fp32, kernels/reference.py), the cross-entropy (layers.py), the
activations a pipeline stage sends (pipeline.py) and the gradient norm.
Micro-batches accumulate in fp32 (Note [fp32 accumulation]).
A checkpoint holds the fp32 masters under the parameters' names (layout-free, as an
fp32 or autocast run's: checkpoint_shards.py), so a resume is exact and an fp32
checkpoint loads.

Note [fp32 accumulation]: with several micro-batches (or a sliced pipeline's slices) per step,
autograd would add each backward's low-precision gradient into the low-precision
``.grad``, rounding the running sum every time. As Megatron's ``main_grad`` and FSDP2's
fp32 ``reduce_dtype``, each parameter's gradients are instead summed in an fp32 buffer
of its own: a post-accumulate-grad hook moves every backward's ``.grad`` into it (and
frees it). On the step's last backward the sum is handed to the reducers as it is: it
becomes ``param.main_grad`` (fp32) and ``.grad`` is freed, and dp.py's buckets, ZeRO-1's
slice, ZeRO-2's buckets (zero.py) and ``MasterAdamW`` read it there (``dp.gradient_of``),
sum it over dp in fp32 and keep the mean in fp32: the step's gradient is never rounded
to the compute dtype. Not handed over, but rounded once into ``.grad`` as before, are the
gradients other code still sums in place in ``.grad`` after backward — the late ones
(dp.py, Note [late gradients]: the tp sum of sequence-parallel gradients, the stages'
tied embedding copies), the experts' (moe.py's ``reduce_expert_grads``, ZeRO's expert
part) — and every gradient of an owner that does not ask for it (``hand_over``).
ZeRO-3 needs neither: each pass reduce-scatters into fp32 shards (fsdp.py, Note
[gradients of a unit]); it keeps this accumulation for its late gradients only.
``MasterAdamW``, ``zero.ShardedAdamW`` and ``fsdp.FullyShardedAdamW`` set it up before
registering their own hooks (hooks run in the order registered); a parameter gets it
once; it counts the step's backwards as dp.py does, so replicated stages' parameters
(each copy sees half the micro-batches: Note [stage replicas] in pipeline_stages.py) keep
autograd's accumulation. Memory: 4 bytes per compute element from the first backward of
a step to the last (the planner's ``buffers``, cost/memory.py), and then, handed over, the gradient itself (4 bytes, not 2: its
``grads``) until the optimizer takes it.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..distributed.comm import on_gradient
from ..parallel.data.dp import drop_gradient, finished_after_backward, gradient_of
from .optim import build_optimizer, clip_grad_norm_
from ..layout.roles import role

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""``train.precision`` → the compute dtype (fp32: none, the parameters stay fp32)."""


def _chunks(model) -> list[nn.Module]:
    return list(model) if isinstance(model, (nn.ModuleList, list, tuple)) else [model]


def unique_parameters(model) -> list[nn.Parameter]:
    seen = {}
    for p in model.parameters():
        seen.setdefault(id(p), p)
    return list(seen.values())


@torch.no_grad()
def to_compute_dtype(model, dtype) -> list[torch.Tensor]:
    """Cast every parameter of ``model`` to ``dtype`` in place (Note [master weights]) and
    return their fp32 values, in ``unique_parameters`` order. Each chunk records the
    dtype (``Transformer.compute_dtype``: a pipeline stage casts what it receives)."""
    params = unique_parameters(model)
    masters = [p.detach().to(torch.float32, copy=True) for p in params]
    for p in params:
        p.data = p.data.to(dtype)
    mark_compute_dtype(model, dtype)
    return masters


def mark_compute_dtype(model, dtype) -> None:
    """Record on each chunk the dtype its parameters compute in (``Transformer.compute_dtype``:
    a pipeline stage casts what it receives); ZeRO calls it for the buffers it casts itself."""
    for chunk in _chunks(model):
        chunk.compute_dtype = dtype


def compute_dtype_of(model):
    """The dtype the parameters compute in (``to_compute_dtype``), None for fp32."""
    return getattr(_chunks(model)[0], "compute_dtype", None)


def hands_over(param) -> bool:
    """Whether the step's fp32 sum goes to the reducers as ``main_grad`` (Note [fp32
    accumulation]): not for gradients summed in ``.grad`` after backward by others."""
    return not finished_after_backward(param) and not role(param).expert_parallel


class Fp32Accumulation:
    """Note [fp32 accumulation] for ``params`` (the low-precision ones that need a
    gradient and have no accumulation yet), over ``accumulations`` backwards a step.
    ``hand_over``: the owner's reducers read ``dp.gradient_of`` (``hands_over``' parameters
    get ``main_grad``)."""

    def __init__(self, params, accumulations: int, *, hand_over: bool = False):
        self.accumulations = int(accumulations)
        self.hand_over = bool(hand_over)
        self.sums: dict[int, torch.Tensor] = {}  # id(param) → this step's fp32 sum so far
        self.count: dict[int, int] = {}
        if self.accumulations < 2:
            return
        for p in params:
            if role(p).pipeline_replica:
                continue  # a stage replica sees half the micro-batches (kept in the compute dtype)
            if p.requires_grad and p.dtype in DTYPES.values() and not getattr(p, "fp32_accumulation", False):
                p.fp32_accumulation = True
                on_gradient(p, self._accumulated)

    @torch.no_grad()
    def _accumulated(self, param) -> None:
        key, grad = id(param), param.grad
        if grad is None:
            return
        n = self.count.get(key, 0) + 1
        total = self.sums.get(key)
        if n < self.accumulations:  # into the fp32 sum; autograd's next gradient starts afresh
            if total is None:
                self.sums[key] = grad.to(torch.float32, copy=True)
            else:
                total.add_(grad)
            param.grad = None
            self.count[key] = n
            return
        if total is not None:  # the last backward of the step
            total.add_(grad)
            del self.sums[key]
            if self.hand_over and hands_over(param):
                param.main_grad, param.grad = total, None  # the fp32 sum, to the reducers
            else:
                grad.copy_(total)  # rounded once
        self.count[key] = 0

    def held_bytes(self) -> int:
        """Bytes of the fp32 sums alive now (between a step's first and last backward)."""
        return sum(t.numel() * t.element_size() for t in self.sums.values())


class MasterAdamW:
    """AdamW on fp32 masters of a low-precision model (Note [master weights])."""

    def __init__(self, model, *, dtype, lr, betas, weight_decay, eps, accumulations=1):
        """``accumulations``: backwards per step (Note [fp32 accumulation])."""
        self.model_params = unique_parameters(model)
        values = to_compute_dtype(model, dtype)
        self.accumulation = Fp32Accumulation(self.model_params, accumulations, hand_over=True)
        self.masters = []
        for p, value in zip(self.model_params, values):
            master = nn.Parameter(value, requires_grad=p.requires_grad)
            master.__dict__.update(p.__dict__)  # tensor_parallel, pipeline_duplicate, ...: the norm's tags
            self.masters.append(master)
        self.master_of = {id(p): m for p, m in zip(self.model_params, self.masters)}
        self.optimizer = build_optimizer(self, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps)

    def parameters(self):
        """The fp32 masters (what ``optim.build_optimizer`` and ``clip_grad_norm_`` walk)."""
        return iter(self.masters)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @torch.no_grad()
    def unscale_and_clip(self, max_norm, *, tp_group, pp_group=None, ep_group=None, etp_group=None,
                         grad_scale: float = 1.0) -> float:
        """The model's gradients (dp means; fp32 or the compute dtype) into the masters' fp32 ``.grad``
        (the model's freed), divided by ``grad_scale`` and clipped to ``max_norm`` there;
        returns the global norm (``optim.clip_grad_norm_``)."""
        for p, master in zip(self.model_params, self.masters):
            grad = gradient_of(p)  # fp32 where the step's sum was handed over (Note [fp32 accumulation])
            master.grad = None if grad is None else grad.to(torch.float32)
            drop_gradient(p)
        return clip_grad_norm_(self, max_norm, tp_group=tp_group, pp_group=pp_group, ep_group=ep_group,
                               etp_group=etp_group, grad_scale=grad_scale)

    @torch.no_grad()
    def step(self) -> None:
        """AdamW on the masters, then their values rounded into the compute weights."""
        self.optimizer.step()
        self.copy_to_model()

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """The masters rounded into the model's parameters (after a step or a checkpoint load)."""
        for p, master in zip(self.model_params, self.masters):
            p.copy_(master)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for p in self.model_params:
            drop_gradient(p)

    def held_grad_bytes(self) -> int:
        """Bytes of the fp32 gradients the masters hold (after ``unscale_and_clip``)."""
        return sum(m.grad.numel() * m.grad.element_size() for m in self.masters if m.grad is not None)

    def state_bytes(self) -> int:
        """Bytes of optimizer state: the fp32 masters and the Adam moments (and ``step``)."""
        total = sum(m.numel() * m.element_size() for m in self.masters)
        for state in self.optimizer.state.values():
            total += sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v))
        return total
