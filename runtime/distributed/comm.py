"""Communication mappings for tensor and sequence parallelism (Megatron style).

Three layers: private primitives that do nothing for a group of one; autograd
Functions pairing a forward collective with its backward; public wrappers whose
docstrings name both directions. Every call takes an explicit ``group``; ``None``
means a group of one. Here the all-reduce and its pairs, all that 1D tensor parallelism
calls (``layers.py``, ``transformer.py``); the collectives along a dim (all-gather,
reduce-scatter, split) and their pairs are ``comm_scatter.py``, the all-to-all exchanges of
context and expert parallelism ``exchange.py`` (each shipped with the features that use it).

Also here: ``exposed_clock`` / ``exposed()``, the time this process spends blocked
on communication (every blocking collective counts whole, an asynchronous one only
its ``wait``), and ``Pending``, a collective in flight (the launches that ``overlap.py``
interleaves with compute are ``comm_async.py``'s, shipped with the features that launch).
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager

import torch
import torch.distributed as dist


class ExposedClock:
    """Seconds spent blocked in communication since ``reset()``, and collectives issued.

    Note [exposed communication]: the step's ``exposed_comm_s`` is the time the
    trainer could not compute because it waited for a collective: a blocking
    collective counts whole; an asynchronous one counts only its ``wait()``, so the
    part that finished behind compute is free. Nested measurements count once.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self._seconds, self._depth, self.collectives = 0.0, 0, 0

    def seconds(self) -> float:
        return self._seconds

    @contextmanager
    def excluded(self):
        """``with``: what the block waits for and issues is not the step's (evaluation runs
        between the step and its record, and step_time_s leaves it out too)."""
        seconds, collectives = self._seconds, self.collectives
        try:
            yield
        finally:
            self._seconds, self.collectives = seconds, collectives

    @contextmanager
    def measure(self):
        self._depth += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._seconds += time.perf_counter() - start


exposed_clock = ExposedClock()


def exposed():
    """``with comm.exposed(): ...``: count the block as time blocked on communication."""
    return exposed_clock.measure()


def _issued() -> None:
    exposed_clock.collectives += 1


def on_gradient(param: torch.Tensor, method, *args) -> None:
    """Call ``method(*args, param)`` each time ``param``'s gradient has accumulated.

    ``method`` is a bound method, reached through a weak reference, and ``args`` must
    not hold tensors: a tensor's hooks live in C++, where Python's gc cannot see the
    cycle parameter → hook → object → parameter, so a strong reference would keep the
    model, and the process groups it holds, alive until the interpreter ends
    (Note [groups die before Python does] in mesh.py).
    """
    ref = weakref.WeakMethod(method)

    def hook(tensor):
        bound = ref()
        if bound is not None:
            bound(*args, tensor)

    param.register_post_accumulate_grad_hook(hook)


def group_size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def scalar_device(group) -> torch.device:
    """Where a small tensor for ``group``'s collectives must live: nccl needs CUDA."""
    if group is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def group_rank(group) -> int:
    return 0 if group is None else dist.get_rank(group)


# ---- primitives -------------------------------------------------------------------


def _all_reduce(x: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """A reduced copy of ``x`` (never in place: ``x`` may be saved for backward)."""
    if group_size(group) == 1:
        return x
    x = x.contiguous().clone()
    _issued()
    with exposed():
        dist.all_reduce(x, op=op, group=group)
    return x


# ---- autograd pairs ---------------------------------------------------------------


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# ---- public wrappers --------------------------------------------------------------


def copy_to_group(x, group):
    """Forward: identity. Backward: all-reduce the gradient over ``group``."""
    return x if group_size(group) == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x, group):
    """Forward: all-reduce over ``group``. Backward: identity."""
    return x if group_size(group) == 1 else _ReduceFromGroup.apply(x, group)


# ---- asynchronous collectives ------------------------------------------------------
# ``Pending``: a collective in flight (dp's buckets; the launches of ``comm_async.py``,
# which overlap.py and moe.py interleave with compute). ``Pending.wait()`` blocks
# (counted as exposed time) and gives the result.


class Pending:
    """A collective in flight; ``wait()`` returns its result (a tensor).

    ``buffer`` is the tensor the collective writes: the result itself, or, for a
    collective along ``dim`` > 0, the result with ``dim`` moved to the front
    (``wait()`` moves it back, as a view).
    """

    __slots__ = ("_work", "buffer", "_dim", "_source")

    def __init__(self, work, buffer: torch.Tensor, dim: int = 0, source: torch.Tensor | None = None):
        self._work, self.buffer, self._dim = work, buffer, dim
        self._source = source  # the input, alive until the collective is done

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            # no_grad: a backend may copy the result into ``buffer`` here, and the buffer
            # may already be an autograd output (overlap.py), whose graph must not change
            with exposed(), torch.no_grad():
                self._work.wait()
            self._work = self._source = None
        return self.buffer.movedim(0, self._dim) if self._dim else self.buffer
