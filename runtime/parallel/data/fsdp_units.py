"""ZeRO-3's units and process groups (used by ``fsdp.py``).

Takes: a unit's parameters and the group they are sharded over; the mesh. Gives:
``Unit`` (one flat buffer, sharded, gathered and freed as a whole: fsdp.py, Note
[units]; ``fill_flat_`` generates its initial slice, Note [counter-based init] in
param_init.py) and ``node_groups``, ``expert_node_groups`` (the shard and replicate groups of
``zero_shard = node``, the dense units' and the experts'); ``SplitBackwardHooks`` (a
chunk's hooks of a split backward: fsdp.py, Note [ZeRO-3 under a split backward]).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist

from ...distributed.comm import exposed, group_rank, group_size
from .dp import finished_after_backward
from ...train.memory import GATHERED_PARAMETERS
from ...models.param_init import fill_, pieces as parameter_pieces
from ...distributed.traffic import comm_bytes


def fill_flat_(out: torch.Tensor, pieces, start: int, *, layers: int, seed: int) -> None:
    """A ZeRO-3 rank's slice: ``out`` gets elements [start, start + out.numel()) of the
    concatenation of ``pieces`` — (name, full_shape, offsets, shape) boxes, each
    flattened row-major, back to back — and zeros past their end (the padding)."""
    stop, at = start + out.numel(), 0
    out.zero_()
    for name, full_shape, offsets, shape in pieces:
        n = math.prod(shape)
        lo, hi = max(start, at), min(stop, at + n)
        if lo < hi:
            fill_(out[lo - start : hi - start], name, full_shape, layers=layers, seed=seed,
                  offsets=offsets, shape=shape, start=lo - at)
        at += n


def materialize_meta(chunks: list, device) -> tuple | None:
    """A model built on the meta device (``model.build_model(materialize=False)``): each
    parameter replaced, in every module holding it, by one on ``device`` that is a
    4-byte zero broadcast to its shape (``Unit`` points it into its flat buffer at the
    first gather), its tags kept. Returns
    ``(pieces, layers, seed)`` for ``Unit``'s ``init``, or None for a built model."""
    if not any(p.is_meta for chunk in chunks for p in chunk.parameters()):
        return None
    pieces, replaced = {}, {}
    for chunk in chunks:
        chunk_pieces = parameter_pieces(chunk)
        for module in chunk.modules():
            for attr, param in list(module._parameters.items()):
                if param is None or not param.is_meta:
                    continue
                if id(param) not in replaced:
                    new = torch.nn.Parameter(torch.zeros((), device=device).expand(param.shape),
                                             requires_grad=param.requires_grad)
                    new.__dict__.update(param.__dict__)  # tensor_parallel, pipeline_duplicate, ...
                    replaced[id(param)] = (param, new)
                    pieces[id(new)] = chunk_pieces[id(param)]
                module._parameters[attr] = replaced[id(param)][1]
    return pieces, chunks[0].config.layers, chunks[0].init_seed


def node_groups(grid, axes: tuple[str, ...], devices_per_node: int):
    """(shard group, replicate group) of this rank for ``zero_shard = node`` (HSDP): the
    ranks of its ``axes`` group (dp, or dp × cp) on its own node, and those holding the
    same shard on the other nodes (None where one rank). Collective: every rank makes
    every group, in the same order."""
    from ...layout.axes import partition

    names = tuple(name for name, _ in grid.axes if name in axes)
    return _by_node(grid, [list(ranks) for ranks in partition(grid.axes, names)], devices_per_node, "×".join(names))


def expert_node_groups(grid, folds: tuple[int, ...], devices_per_node: int):
    """(shard group, replicate group) of this rank's experts under ``zero_shard = node``
    (fsdp.py, Note [experts as units]): its edp ranks (expert_folding.py, Note [parallel folding];
    ``folds``: the expert layers' degrees, as ``expert_groups`` there takes them) on its own
    node, and those holding the same expert shard on the other nodes. Collective, as
    ``node_groups``."""
    from ...distributed.expert_folding import expert_partitions  # shipped with experts

    return _by_node(grid, expert_partitions(grid, *folds)["edp"], devices_per_node, "edp")


def _by_node(grid, groups: list[list[int]], devices_per_node: int, what: str):
    """Each group's ranks split by node (the shards) and across nodes (the replicas);
    this rank's two, None where one rank."""
    mine = {}
    for ranks in groups:
        by_node = {}
        for rank in ranks:
            by_node.setdefault(rank // devices_per_node, []).append(rank)
        shards = list(by_node.values())
        if len({len(shard) for shard in shards}) != 1:
            raise ValueError(f"zero_shard = node: the {what} ranks {ranks} do not split evenly over nodes")
        for kind, members_of in (("shard", shards), ("replicate", [list(c) for c in zip(*shards)])):
            for members in members_of:
                group = dist.new_group(members) if len(members) > 1 else None
                if grid.rank in members:
                    mine[kind] = group
    return mine.get("shard"), mine.get("replicate")


@torch.no_grad()
def sum_over_replicas(grad: torch.Tensor, parts: list, reduce_dtype=None) -> None:
    """HSDP (fsdp.py, Note [gradients of a unit]): ``grad``, the rank's fp32 shards, summed
    in place over each (replicate group, mask) of ``parts``: the dense shards (mask None,
    or all but the experts' mask given next) over the dense replicas, the experts' (their
    mask) over theirs. On the wire in ``reduce_dtype`` when given (zero.py, Note [bf16
    reduction under ZeRO]). A group of one (None) is skipped."""
    experts = next((mask for _, mask in parts if mask is not None), None)
    for group, mask in parts:
        if group_size(group) <= 1:
            continue
        if mask is None:
            mask = None if experts is None else ~experts
        part = grad if mask is None else grad[mask]
        wire = part if reduce_dtype is None else part.to(reduce_dtype)
        comm_bytes.add("dp", wire)
        with exposed():
            dist.all_reduce(wire, group=group)
        if wire is not grad:
            if mask is None:
                grad.copy_(wire)
            else:
                grad[mask] = wire.to(grad.dtype)


class Unit:
    """One group of parameters gathered and freed together (fsdp.py, Note [units])."""

    def __init__(self, name: str, params: list, *, shard_group, offset: int, flat: torch.Tensor, init=None,
                 dtype=torch.float32, partial=finished_after_backward):
        """``init`` (a model built on the meta device): ``(pieces, layers, seed)`` of
        param_init — this rank's slice is generated (Note [counter-based init]) and the
        parameters' own (placeholder) values are never read. ``dtype``: the gathered
        parameters' (bf16/fp16 compute weights: the fp32 shard is their master, and the
        all-gather carries the rounded shard, half the bytes; master.py). ``partial``: which
        parameters' gradients are still partial when backward ends (dp.py, Note [late gradients])."""
        self.name, self.params, self.group, self.dtype = name, params, shard_group, dtype
        self.size, rank = group_size(shard_group), group_rank(shard_group)
        self.numel = sum(p.numel() for p in params)
        self.shard_numel = -(-self.numel // self.size)
        self.padded = self.shard_numel * self.size
        self.offset = offset  # where this unit's shard sits in the optimizer's flat shards
        # fsdp.py, Note [gradients of a unit]: which parameters' gradients are reduced pass by
        # pass; a unit mostly late (a stage's tied embedding copy) waits whole for the step's end
        self.early = [not partial(p) for p in params]
        if 2 * sum(p.numel() for p, early in zip(params, self.early) if not early) > self.numel:
            self.early = [False] * len(params)
        self.late = not all(self.early)
        for p in params:
            if p.dtype != torch.float32:
                raise ValueError(f"ZeRO-3 keeps fp32 parameters; got {p.dtype}")
        self.shard = flat[offset : offset + self.shard_numel]
        self.full = None
        if init is None:
            full, at = torch.zeros(self.padded, dtype=torch.float32, device=flat.device), 0
            with torch.no_grad():
                for p in params:
                    full[at : at + p.numel()].copy_(p.reshape(-1))
                    at += p.numel()
            self.shard.copy_(full[rank * self.shard_numel : (rank + 1) * self.shard_numel])
            self._adopt(full.to(dtype))
        else:  # the parameters become views of the flat buffer at its first gather (``launch``)
            pieces, layers, seed = init
            fill_flat_(self.shard, [pieces[id(p)] for p in params], rank * self.shard_numel, layers=layers, seed=seed)
        self.gathered, self.work = init is None, None
        self.pending = len(params)  # parameters still to accumulate in this backward pass
        self.passes = 0  # backward passes this step
        self.free()

    def nbytes(self) -> int:
        return self.padded * self.dtype.itemsize

    @torch.no_grad()
    def _adopt(self, full: torch.Tensor) -> None:
        """Make ``full`` the flat buffer and every parameter a view of its part of it."""
        self.full, at = full, 0
        for p in self.params:
            n = p.numel()
            p.data = full[at : at + n].view(p.shape)
            at += n

    def launch(self) -> None:
        """Start the all-gather of the shards into the flat buffer (asynchronous)."""
        if self.gathered:
            return
        if self.full is None:  # a unit generated in place (``init``): its first gather
            self._adopt(torch.empty(self.padded, dtype=self.dtype, device=self.shard.device))
        else:
            self.full.untyped_storage().resize_(self.nbytes())
        self.gathered = True
        GATHERED_PARAMETERS.add(self.full.untyped_storage().data_ptr())
        if self.size == 1:
            self.full.copy_(self.shard)
            return
        mine = self.shard if self.dtype == self.shard.dtype else self.shard.to(self.dtype)  # rounded: sent so
        comm_bytes.add("dp_params", mine)  # this rank's part, at every gather (Note [comm bytes])
        if dist.get_backend(self.group) == "nccl":
            self.work = dist.all_gather_into_tensor(self.full, mine, group=self.group, async_op=True)
        else:
            self.work = dist.all_gather(list(self.full.chunk(self.size)), mine, group=self.group, async_op=True)

    def wait(self) -> None:
        self.launch()
        if self.work is not None:
            with exposed():
                self.work.wait()
            self.work = None

    def free(self) -> None:
        if not self.gathered:
            return
        self.wait()
        GATHERED_PARAMETERS.discard(self.full.untyped_storage().data_ptr())
        self.full.untyped_storage().resize_(0)
        self.gathered = False


class SplitBackwardHooks:
    """A chunk's ``split_backward_hooks`` (split_backward.py, Note [hooks of a split
    backward]) under ZeRO-3: fsdp.py, Note [ZeRO-3 under a split backward]."""

    def __init__(self, optimizer, units: list):
        """``optimizer``: the ``fsdp.FullyShardedAdamW`` whose ``units`` (a chunk's) these are."""
        self.optimizer, self.units = optimizer, units

    @contextlib.contextmanager
    def inputs(self):
        """Around a B pass: each block is freed once the previous block's B begins, and
        whatever is still gathered when B ends (the first block, a prefetch) then."""
        optimizer = self.optimizer
        optimizer.inputs_only = True
        try:
            yield
        finally:
            optimizer.inputs_only = False
            for unit in self.units:
                if unit.pending == len(unit.params):  # no W half done with it
                    unit.free()

    def weights(self, params: list, later) -> None:
        """Before a W group: gather the units of ``params``, and launch those of the next
        groups (``later``, an iterable of parameter lists: Note [prefetch]). Each unit is freed, and
        its gradients reduce-scattered, once its parameters have all accumulated."""
        unit_of, units, upcoming = self.optimizer.unit_of, [], []
        for p in params:
            unit = unit_of.get(id(p))
            if unit is not None and unit not in units:
                units.append(unit)
        for group in later:
            for p in group:
                unit = unit_of.get(id(p))
                if unit is not None and unit not in units and [unit] not in upcoming:
                    upcoming.append([unit])
            if len(upcoming) >= self.optimizer.prefetch:
                break
        self.optimizer.use(units, upcoming)
