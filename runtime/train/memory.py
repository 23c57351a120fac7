"""What a rank holds, in bytes: parameters, gradients, optimizer state, saved activations.

Takes: the rank's model (or pipeline chunks) and optimizer. Gives: ``param_bytes``,
``grad_bytes``, ``optim_bytes`` and ``SavedActivations``, whose peak is the most bytes
of tensors saved for backward alive at once during a step. The trainer logs them as
``param_bytes, grad_bytes, optim_bytes, activation_peak_bytes`` so the planner's
memory model (codegen) can be checked against measurement. The definitions:

- ``param_bytes``: numel × element size over this rank's parameters (a pipeline
  stage's copy of a tied embedding counts: the rank holds it; ZeRO's padding of the
  flat buffer does not: it is not a parameter). Under ZeRO-3 the resident shards
  (fsdp.py: Σ over units of 4·⌈n_unit/s⌉, padding included: the rank holds it), and
  apart ``param_gathered_peak_bytes``, the most bytes of gathered units alive at once.
- ``grad_bytes``: gradient bytes held when backward ends: every ``param.grad`` (and
  ``main_grad``, the step's fp32 sum that master.py hands to the reducers) plus
  any gradient the optimizer keeps itself (ZeRO-2's reduce-scattered slice).
- ``optim_bytes``: every tensor of the optimizer's state (AdamW: two moments per
  element, and torch's 4-byte ``step`` tensor per parameter; ZeRO: the moments of
  its slice).

Note [counting saved activations]: a ``saved_tensors_hooks`` pair sees every tensor
autograd saves for backward while the context is open. The pack hook records the
tensor's storage (several saved tensors often share one: views, the same input saved
by two ops) in a table of live storages, and returns a small holder; when autograd
frees the saved tensor after its backward, the holder dies and the storage's count
drops. Parameters are not activations and are skipped. Inside a
``torch.utils.checkpoint`` region the checkpoint's own hooks take over, so what
recompute drops is, rightly, not counted; the region's inputs, which checkpoint keeps,
are. CPU and CUDA alike: this counts tensors, not allocator blocks.

A holder keeps its tensor alive, and a tensor an op saves of its own output (softmax,
attention) points back at that op through ``grad_fn``: node → holder → tensor → node,
a cycle through C++ that Python's gc cannot see. Backward breaks it by freeing each
node's saved tensors, except where a graph is kept (``retain_graph``: zero_bubble's B
keeps the input path for W). So when the ``with`` closes — the step's every backward
is done — each holder still alive lets go of its tensor; otherwise those graphs, and
the process groups their autograd Functions hold, would outlive the trainer
(Note [groups die before Python does] in mesh.py).
"""

from __future__ import annotations

import weakref

import torch

GATHERED_PARAMETERS: set[int] = set()
"""Data pointers of ZeRO-3's gathered parameter buffers (``fsdp.py`` keeps it): their
views are parameters, not activations, though their storage comes and goes."""


def _unique_params(model):
    seen = {}
    for p in model.parameters():
        seen.setdefault(id(p), p)
    return list(seen.values())


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in _unique_params(model))


def grad_bytes(model, optimizer=None) -> int:
    held = sum(g.numel() * g.element_size() for p in _unique_params(model)
               for g in (p.grad, getattr(p, "main_grad", None)) if g is not None)  # main_grad: master.py's fp32 sum
    kept = getattr(optimizer, "held_grad_bytes", None)
    return held + (kept() if kept is not None else 0)


def optim_bytes(optimizer) -> int:
    state_bytes = getattr(optimizer, "state_bytes", None)
    if state_bytes is not None:
        return int(state_bytes())
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
    return total


# Note [memory on some steps]: the saved-tensor hooks cost a Python call per tensor
# autograd keeps, and ``report`` an all-gather over every rank: measured on every step
# they slow it (bench/overheads.py). The trainer measures on the first two steps of a
# run, every ``--memory-every`` N-th step and the last, the same steps on every rank
# (``report`` is collective); the other records have no memory fields.


def measured(step: int, *, every: int, first: int, last: int) -> bool:
    """Whether ``step`` measures memory (Note [memory on some steps]); every = 1: all."""
    return step < first + 2 or step == last or (every > 0 and step % every == 0)


class _Saved:
    """What the pack hook hands autograd: the tensor, and a way to notice its release."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class SavedActivations:
    """Peak bytes of tensors saved for backward; use as ``with meter: forward; backward``.

    See Note [counting saved activations]. ``peak`` is in bytes, for the last ``with``.
    """

    def __init__(self, model):
        self.active = True  # False: ``with`` measures nothing (Note [memory on some steps])
        self._params = {p.untyped_storage().data_ptr() for p in _unique_params(model)}
        self._live = {}  # storage key -> [holders alive, bytes]
        self._generation = 0  # a holder from an earlier ``with`` must not touch this one's table
        self.current = self.peak = 0
        self._holders = weakref.WeakSet()  # this ``with``'s holders still alive
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self):
        if not self.active:
            return self
        self._generation += 1
        self._live.clear()
        self._holders = weakref.WeakSet()
        self.current = self.peak = 0
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        if self.active:
            self._hooks.__exit__(*exc)
            for holder in list(self._holders):  # graphs kept past their backward
                holder.tensor = None
        return False

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        key = (storage.device.type, storage.data_ptr())
        if key[1] in self._params or key[1] in GATHERED_PARAMETERS or storage.nbytes() == 0:
            return tensor
        holder = _Saved(tensor)
        entry = self._live.get(key)
        if entry is None:
            entry = self._live[key] = [0, storage.nbytes()]
            self.current += entry[1]
            self.peak = max(self.peak, self.current)
        entry[0] += 1
        weakref.finalize(holder, self._release, self._generation, key)
        self._holders.add(holder)
        return holder

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _release(self, generation, key):
        if generation != self._generation:
            return
        entry = self._live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.current -= entry[1]
            del self._live[key]


def report(model, optimizer, activations, held_grad_bytes) -> dict:
    """The four memory figures of this rank, and every rank's (``memory_per_rank``).

    Collective when a process group is up: every rank must call it at the same step.
    The top-level figures are this rank's (rank 0's in the metrics file).
    """
    resident = getattr(optimizer, "resident_param_bytes", None)  # ZeRO-3: the shards kept
    mine = [
        param_bytes(model) if resident is None else resident(),
        int(held_grad_bytes),
        optim_bytes(optimizer),
        int(activations.peak),
    ]
    rows = [mine]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        device = next(model.parameters()).device
        local = torch.tensor(mine, dtype=torch.int64, device=device)
        gathered = [torch.empty_like(local) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(gathered, local)
        rows = [[int(v) for v in t.tolist()] for t in gathered]
    keys = ("param_bytes", "grad_bytes", "optim_bytes", "activation_peak_bytes")
    record = dict(zip(keys, mine))
    record["memory_per_rank"] = [dict(zip(keys, row)) for row in rows]
    gathered = getattr(optimizer, "gathered_peak_bytes", None)
    if gathered is not None:  # ZeRO-3: the most bytes of gathered units at once, apart
        record["param_gathered_peak_bytes"] = int(gathered)
    return record
