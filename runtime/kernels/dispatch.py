"""How a fused op is entered: through its torch custom op, or straight into its kernel.

Every call of a fused op (``ops.py``) goes through ``call(op, *args)``: the one place
that decides the path. Note [custom-op dispatch]: a ``torch.library.custom_op`` call
crosses the C++ dispatcher twice (Python → dispatcher → autograd key → the op's
Python body) and checks its schema on the way; at the shapes of a small model that
costs more than the kernel (a LayerNorm forward and backward at 128×128: 119 µs as a
custom op, 60 µs as an ``autograd.Function``, 45 µs eager). The custom op is what
``torch.compile`` and fake tensors need, and nothing else does, so when nothing
traces the same Python body runs inside an ``autograd.Function`` whose
``setup_context`` and ``backward`` are the ones the op registered (and an op without
autograd, a backward kernel, runs as its body): the same kernels and formulas, the
same numbers, bit for bit.

The op itself runs whenever the direct path could differ: under ``torch.compile`` or
any ``__torch_dispatch__`` mode (FakeTensorMode, the planner's tracing), on tensors
that are subclasses or on the meta device, and for an op without autograd when a
gradient through it is asked for (the op raises the error that explains it).

Note [eager at small shapes]: even the direct path costs a Python ``autograd.Function``
per call, more than eager PyTorch's C++ autograd node: about 20 µs more per forward
and backward on this machine (LayerNorm at 64×64: the kernels alone take 3.6 + 4.1
µs against eager's 4.7 + 7.1, the whole step 52 µs against 32). Below some size the
kernel's saving does not pay for it. ``compiled_pays(kind, elements, device)`` says,
once per model (``model.use_kernels``), whether a kind of fused op is worth its call
at the model's size: ``elements`` is the model's global, layout-independent size of
one sequence's tensor for that op (seq_len × hidden; seq_len × the MLP's own width
for swiglu and bias_gelu, which for the shared experts is shared_experts ·
expert_ffn). Local shapes would differ by layout (tp, sp, cp shard them) and so would
the choice, and with it the floats: one build must pick the same path on every rank
and in every layout. Each kind has its own size in ``EAGER_BELOW``, the smallest
measured size from which it clearly beats eager (bench/overheads.py --only small,
forward + backward, eager / parc, best of 9, 1 thread as a rank of a multi-rank run
has; the figures in the comments are from one run at load 1.8; 2 threads, at load 7,
gave the same choices); CUDA
always takes the kernels (Triton, not measured here). ``PARC_KERNELS_EAGER_BELOW``
replaces every size (0: always the kernels; the tests use it so their tiny models
run the kernels they check).
"""

from __future__ import annotations


import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..layout.kernel_sizes import EAGER_BELOW, pays  # noqa: F401  (EAGER_BELOW: bench/overheads.py's rows)

_FUNCTIONS: dict = {}
"""custom op → the ``autograd.Function`` made from it (``_as_function``), built once."""

_PLAIN = (torch.Tensor, torch.nn.Parameter)

def compiled_pays(kind: str, elements: int, device) -> bool:
    """Whether the fused ``kind`` of op beats eager PyTorch at ``elements`` (Note [eager at
    small shapes]); decided once per model from its global shapes (``kernel_sizes.pays``)."""
    return pays(kind, elements, cpu=torch.device(device).type == "cpu")


def call(op, *args):
    """``op(*args)``, for a ``torch.library.custom_op`` ``op``, by the cheaper path that
    gives the same result (Note [custom-op dispatch])."""
    if not _direct(args):
        return op(*args)
    needs_grad = torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    if op._backward_fn is None:
        return op(*args) if needs_grad else op._init_fn(*args)
    if not needs_grad:  # as the op's own autograd kernel: the body, no graph
        return op._init_fn(*args)
    function = _FUNCTIONS.get(op)
    if function is None:
        function = _FUNCTIONS[op] = _as_function(op)
    return function.apply(*args)


def _direct(args) -> bool:
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return False
    for a in args:
        if isinstance(a, torch.Tensor) and (type(a) not in _PLAIN or a.is_meta):
            return False
    return True


def _as_function(op):
    # The op's own autograd kernel (torch/_library/autograd.py) is such a Function: its
    # forward runs the body and then setup_context. Written the same way (setup inside
    # forward, no ``setup_context`` staticmethod), ``apply`` skips the
    # ``inspect.signature`` bind it does on every call of a Function that has one.
    body, setup, backward = op._init_fn, op._setup_context_fn, op._backward_fn

    class Direct(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            output = body(*args)
            setup(ctx, args, output)
            return output

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    Direct.__name__ = Direct.__qualname__ = f"Direct_{body.__name__}"
    return Direct
