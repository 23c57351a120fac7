"""ZeRO stage 3 (fully sharded data parallel): parameters, gradients and AdamW state sharded.

Takes: the model (a ``Transformer`` or the ``nn.ModuleList`` of a pipeline rank's
chunks), the group the parameters are sharded over (dp, dp × cp under context
parallel, or the dp ranks of one node under ``zero_shard = node``), the group they are
replicated over (the other nodes' copies, HSDP; None otherwise), the tp and pp groups,
AdamW's hyper-parameters, the micro-batches per step and the prefetch depth.
Gives: ``FullyShardedAdamW``, used like ``zero.ShardedAdamW``: after the last
micro-batch's backward (each pass has reduce-scattered its gradients already: Note
[gradients of a unit]) ``reduce_gradients_and_clip(max_norm)`` (the global gradient
norm), then ``step()`` and ``zero_grad()``.

Note [units]: as FSDP2's per-module groups, every transformer block is one unit, and
the rest of a chunk (embeddings, final norm, head: the "root") another. A unit's
parameters are views into one flat fp32 buffer of its own, padded to a multiple of
the shard group's size s; shard rank r keeps the r-th contiguous 1/s of it, and the
optimizer holds only those shards (all units' shards back to back: ``self.flat``).
Between uses the flat buffer's storage is freed (resized to 0 bytes: the parameters
keep their shapes, autograd its saved views); ``_gather`` re-allocates it and
all-gathers the shards into it.

Note [when a unit is gathered]: a block is gathered by its forward pre-hook and
freed by its forward post-hook; the hook also puts a hook on the block's output
whose gradient arrives just before the block's backward (the "pre-backward"), which
gathers it again; once every parameter of the unit has accumulated its gradient in
that backward pass the unit is freed. The root is gathered for the whole forward of
its chunk (the head uses the embedding when tied) and again from the chunk output's
pre-backward to the end of its backward. A forward that autograd runs inside
backward (``recompute = full``'s rerun) finds its unit gathered and leaves it so.
Every use checks the unit is gathered, so a prefetch that a pipeline schedule does not
consume is only wasted, never wrong.

Note [experts as units]: under expert parallelism (``mesh.expert_groups``) a MoE block's
experts differ between the dp ranks, so they are a unit of their own (``layers.i.experts``),
sharded over the ranks that hold the same experts (edp, mesh.py's Note [parallel
folding]) and gathered and freed with the block's dense unit. Their gradients, already
summed over the ep group's tokens by the combine's backward, are reduce-scattered over
edp and divided by the dp ranks whose mean loss the step takes (as
``moe.reduce_expert_grads``); the global norm adds their squares summed over edp and the
other expert groups. Under ``zero_shard = node`` (HSDP) they shard over the edp ranks of
their node and are replicated over the edp ranks at the same place on the other nodes
(``fsdp_units.expert_node_groups``), as the dense units over dp, and as torchtitan's
HSDP with ep: each reduce-scatter stays on the node, the replicas' expert shards are summed
across nodes once a step beside the dense ones, and the norm sums their squares over the
node's edp ranks (a replica holds the same shard) and the other expert groups.

Note [ZeRO-3 over per-layer layouts]: in a heterogeneous stage (hetero.py, Note
[heterogeneous layouts]) a block at tp t is a unit sharded over its own layer's dp group
(the S / t ranks with its tp index, which hold the same tp shard of it); the chunk's
root is one unit per degree among the embedding and the head (``chunk0.root.tp2``),
each over its own layer's dp group. A unit's gradients are reduced over that group and
divided by the coarse dp, as ``hetero.HeteroGradients`` divides. In the norm a shard
element of a tp-sharded parameter is held once in the stage, one of a replicated
parameter by the t dp groups of its layer: each rank adds its squares (the latter
divided by t), and one sum over the stage (and the pipeline) gives the one-rank norm.
Checkpoints see only units with groups (checkpoint_shards.py), so they stay layout-free.

Note [ZeRO-3 under a split backward]: zero_bubble's and zero_bubble_v's B pass (input
gradients) needs a block's parameters, and so does its W pass (weight gradients), which
may run several micro-batches later (split_backward.py). parc regathers for W rather
than keeping the block gathered from B to W: kept, every block whose W is owed stays
whole, up to a stage's parameters for most of the step (ZB-H1 owes min(p, M) Ws), what
ZeRO-3 exists to avoid; regathered, at most 1 + prefetch blocks are gathered at any
time, as under 1F1B, for one more all-gather per block and micro-batch (three: F, B and
W; the first stage's W runs its whole backward, so two there), priced in the planner
(cost/time.py, Note [ZeRO-3 gathers]). So each chunk carries ``split_backward_hooks``
(``fsdp_units.SplitBackwardHooks``): in B, a block's pre-backward frees the block after it (its B is
over; nothing accumulates in B) and the end of B frees the rest; before each W group
its units are gathered (the next groups' prefetched), and as in any backward a unit is
freed, and its gradients reduce-scattered, once its parameters have all accumulated
(Note [gradients of a unit]: a W is one pass). HSDP (``zero_shard = node``) is the same
code path over other groups.

Note [prefetch]: gathering a unit first waits its all-gather, then launches the
asynchronous all-gathers of the next ``prefetch`` units in the order they will run
(forward: the following blocks; backward: the preceding ones), so they travel while
this unit computes. At most 1 + prefetch blocks are gathered at once.

Note [gradients of a unit]: as FSDP2 and DeepSpeed's ZeRO-3, every backward pass of a
unit (each micro-batch's, each token slice's: a pass ends once every parameter of
the unit has accumulated, whatever the schedule interleaves between passes) packs the
unit's gradients into its padded fp32 layout, frees ``.grad``, and reduce-scatters the
pack (nccl; all-reduced and sliced on gloo, which has no reduce-scatter) over the shard
group, asynchronously: the next unit's launch (or ``reduce_gradients_and_clip``) waits
it and adds this rank's shard, divided by the data-parallel size, into the step's fp32
sharded accumulator ``self.grad``. So no rank holds a whole gradient between
micro-batches (Ψ, fp32 sums under bf16/fp16 parameters: 4Ψ bytes, what ZeRO-3 exists to
avoid); only the pack in flight (one unit's) is whole. Under bf16/fp16 the pack is fp32,
so the step's sum never rounds (but for ``train.grad_reduce = bf16``, which sends the pack,
and HSDP's sum below, in bf16 and takes the shard back into fp32 before the mean: zero.py,
Note [bf16 reduction under ZeRO]) (master.py's ``Fp32Accumulation`` is left to the late
gradients). Parameters whose gradient is still partial when backward ends (dp.py, Note
[late gradients]: sequence-parallel replicated ones, a stage's tied embedding copy) keep
accumulating in ``.grad`` (fp32 sums under bf16: ``Fp32Accumulation``); a unit holding
some is reduced pass by pass but for its last pass, whose gradients wait in ``.grad``
with the late ones until the trainer has summed those, and go in one reduce-scatter at
the step's end: M reduce-scatters a step, as every unit's, the last pass's gradient
whole until then (under sp every block holds a norm: FSDP2 sums such gradients over tp
inside backward, DTensor's Partial; parc's trainer after it). A unit mostly late (a
stage's tied embedding copy) waits whole, as does what a partial pass left (a parameter
that got no gradient in some pass). HSDP (``zero_shard = node``): the shards are summed over the replicas once a
step, one all-reduce of ``self.grad`` across nodes after the last drain (as FSDP2's
``set_requires_all_reduce(False)`` on all but the last micro-batch): the sum is linear,
so once is exact, and it is the slow link's traffic that it divides by the micro-batches.
Note [ZeRO-3 over stage replicas]: under a placement whose stages are held twice (rank r
and its partner p−1−r hold the same two stages, one in each pipeline; Note [stage
replicas] in models/model.py) each replica's units are sharded over its own dp group, and
the two replicas' gradients must be summed. Each rank orders its units by stage, so its
flat shards and its partner's line up element for element; the units reduce-scatter as any
others (a replica's gradient is not late here), and the partner's shards are added once a
step after the last drain, one all-reduce of ``self.grad`` over ``replica_group``, as HSDP's
cross-node sum (the sum is linear, so summing the shards is summing the gradients). ZeRO-1/2
instead sum the whole gradients before their reduction (``pipeline.allreduce_replica_grads``).
No switch keeps the old once-a-step reduce-scatter: that trade (Ψ of gradients held
across micro-batches for M× fewer reduce-scatters) is ``zero = 2``'s, which the planner
already weighs against ZeRO-3. The AdamW update and the global norm are
``zero.flat_adamw_`` and ``zero.clip_global_norm_``.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn as nn

from ...distributed.comm import exposed, group_rank, group_size, on_gradient
from .dp import finished_after_backward
from .fsdp_units import SplitBackwardHooks, Unit, materialize_meta, sum_over_replicas
from .fsdp_units import node_groups, expert_node_groups  # noqa: F401  (train.py's, under zero_shard = node)
from ...optimizers.master import Fp32Accumulation, mark_compute_dtype
from ...optimizers.optim import clip_to_norm_
from ...distributed.traffic import comm_bytes
from .zero import clip_global_norm_, decay_runs, flat_adamw_, global_squares, sums_apart
from ...layout.roles import role


def _in_backward() -> bool:
    """Is autograd running a backward pass on this thread (a recompute's forward)?"""
    return torch._C._current_graph_task_id() != -1


class FullyShardedAdamW:
    def __init__(
        self, model, *, dp_group, tp_group, lr, betas, weight_decay, eps, pp_group=None,
        replicate_group=None, accumulations=1, prefetch=1, ep_group=None, edp_group=None, etp_group=None,
        data_ranks=None, compute_dtype=None, layouts=None, stage_group=None, edp_replicate_group=None,
        reduce_dtype=None, replica_group=None,
    ):
        """``ep_group``, ``edp_group``, ``etp_group``, ``data_ranks``: expert parallelism's
        groups and the ranks the loss is a mean over (Note [experts as units]).
        ``edp_replicate_group``: the experts' replicas under ``zero_shard = node`` (then
        ``edp_group`` is the node's edp ranks). ``reduce_dtype`` (``train.grad_reduce = bf16``):
        the dtype of every gradient reduction (Note [gradients of a unit]).
        ``compute_dtype`` (bf16/fp16, master.py's Note [master weights]): the gathered
        parameters' dtype; the shards stay fp32, the master weights. ``layouts``,
        ``stage_group``: a heterogeneous stage's (Note [ZeRO-3 over per-layer layouts]).
        ``replica_group``: the rank holding the same stages in the other pipeline
        (Note [ZeRO-3 over stage replicas])."""
        if int(accumulations) < 1 or int(prefetch) < 0:
            raise ValueError(f"accumulations must be >= 1 and prefetch >= 0, not {accumulations!r}, {prefetch!r}")
        self.dp_group, self.replicate_group = dp_group, replicate_group
        self.edp_replicate_group, self.reduce_dtype = edp_replicate_group, reduce_dtype
        self.tp_group, self.pp_group = tp_group, pp_group
        self.accumulations, self.prefetch = int(accumulations), int(prefetch)
        self.beta1, self.beta2 = (float(b) for b in betas)
        self.eps, self.weight_decay = float(eps), float(weight_decay)
        self.param_groups = [{"lr": float(lr)}]
        self.data_parallel = group_size(dp_group) * group_size(replicate_group)  # the mean's divisor
        # the experts' shards' squares: over the (node's) edp ranks and the other expert groups
        self.expert_groups = tuple(g for g in (edp_group, ep_group, etp_group) if group_size(g) > 1)
        self.layouts, self.stage_group = layouts, stage_group
        if layouts is not None:
            if group_size(replicate_group) > 1 or group_size(edp_group) > 1 or group_size(ep_group) > 1:
                raise ValueError("ZeRO-3 over per-layer layouts is built without zero_shard = node and experts")
            self.data_parallel = layouts.dp  # each layer's sum over its dp group / the coarse replicas
        chunks = list(model) if isinstance(model, nn.ModuleList) else [model]
        self.replica_group, partial = replica_group, finished_after_backward
        if group_size(replica_group) > 1:  # Note [ZeRO-3 over stage replicas]
            if layouts is not None or group_size(replicate_group) > 1:
                raise ValueError("ZeRO-3 over stage replicas is built without per-layer layouts and zero_shard = node")
            chunks = sorted(chunks, key=lambda chunk: chunk.stage_index)  # both replicas' shards line up
            partial = functools.partial(finished_after_backward, replicas=False)
        # Note [counter-based init]: a model built on the meta device gets its values here,
        # each rank generating only its slices
        init = materialize_meta(chunks, getattr(chunks[0], "init_device", None))
        plan = []  # (name, params, chunk index, kind)
        for index, chunk in enumerate(chunks):
            in_blocks = {id(p) for block in chunk.layers.values() for p in block.parameters()}
            root = [p for p in chunk.parameters() if id(p) not in in_blocks and p.requires_grad]
            for suffix, params in _roots(root, layouts):
                plan.append((f"chunk{index}.root{suffix}", params))
            for key, block in chunk.layers.items():
                params = [p for p in block.parameters() if p.requires_grad]
                experts = [p for p in params if role(p).expert_parallel]
                plan.append((f"layers.{key}", [p for p in params if not role(p).expert_parallel]))
                if experts:  # Note [experts as units]
                    if data_ranks is None:
                        raise ValueError("expert-parallel parameters under ZeRO-3 need data_ranks")
                    plan.append((f"layers.{key}.experts", experts))
        group_of = {name: edp_group if name.endswith(".experts") else dp_group for name, _ in plan}
        if layouts is not None:  # Note [ZeRO-3 over per-layer layouts]: each unit over its layer's dp group
            group_of = {name: layouts.dp_group(int(role(params[0]).layer_tp)) for name, params in plan}
        total = sum(-(-sum(p.numel() for p in params) // group_size(group_of[name])) for name, params in plan)
        device = getattr(chunks[0], "init_device", None) or plan[0][1][0].device
        self.flat = torch.zeros(total, dtype=torch.float32, device=device)  # this rank's shards
        self.units, offset = [], 0
        for name, params in plan:
            self.units.append(Unit(name, params, shard_group=group_of[name], offset=offset, flat=self.flat,
                                   init=init, dtype=compute_dtype or torch.float32, partial=partial))
            self.units[-1].divisor = int(data_ranks) if name.endswith(".experts") else self.data_parallel
            offset += self.units[-1].shard_numel
        self.decay, self.tp_mask, self.counted = (self._mask(rule) for rule in (
            lambda p: p.dim() >= 2,
            lambda p: bool(role(p).tensor_parallel),
            lambda p: not role(p).pipeline_duplicate,
        ))
        self.decay_runs = decay_runs(self.decay)  # what flat_adamw_ updates with and without decay
        # Note [experts as units]: which shard elements are experts' (None: a dense model,
        # no bool per element kept for nothing)
        experts = any(unit.name.endswith(".experts") for unit in self.units)
        self.expert_mask = self._mask(lambda p: bool(role(p).expert_parallel)) if experts else None
        # a value held by k ranks of a 2D tp grid counts 1/k on each (layers2d.py); None: 1D
        copied = any(int((role(p).tp_copies or 1)) != 1 for unit in self.units for p in unit.params)
        self.tp_share = (self._mask(lambda p: 1.0 / int((role(p).tp_copies or 1)), dtype=torch.float32)
                         if copied else None)
        self.state = {
            "step": 0,
            "exp_avg": torch.zeros_like(self.flat),
            "exp_avg_sq": torch.zeros_like(self.flat),
        }
        self.grad, self._inflight = None, None
        # master.py, Note [fp32 accumulation], for the late gradients only (Note [gradients
        # of a unit]): before this optimizer's own gradient hooks
        late = [p for unit in self.units for p, early in zip(unit.params, unit.early) if not early]
        self.accumulation = Fp32Accumulation(late, self.accumulations)
        self._peak = self.gathered_peak_bytes = 0  # this step's, and the last step's
        self.inputs_only = False  # inside a B pass (Note [ZeRO-3 under a split backward])
        self.unit_of = {id(p): unit for unit in self.units for p in unit.params}
        self._hook(chunks)
        if compute_dtype is not None:
            mark_compute_dtype(chunks, compute_dtype)

    def _mask(self, rule, dtype=torch.bool) -> torch.Tensor:
        """A per-element flag (or, with ``dtype``, value) of this rank's shards (False or 0 on padding)."""
        mask = torch.zeros(self.flat.numel(), dtype=dtype, device=self.flat.device)
        for unit in self.units:
            whole = torch.zeros(unit.padded, dtype=dtype, device=self.flat.device)
            at = 0
            for p in unit.params:
                whole[at : at + p.numel()] = rule(p)
                at += p.numel()
            rank = group_rank(unit.group)
            mask[unit.offset : unit.offset + unit.shard_numel] = whole[
                rank * unit.shard_numel : (rank + 1) * unit.shard_numel
            ]
        return mask

    # ---- Note [when a unit is gathered] ---------------------------------------------

    def _hook(self, chunks) -> None:
        """Each block's units (one, or its dense part and its experts: Note [experts as
        units]) are gathered and freed together by its hooks; each frees itself, and
        reduces its gradients, once its own parameters have accumulated."""
        by_name = {unit.name: unit for unit in self.units}
        for index, chunk in enumerate(chunks):
            blocks = [[by_name[name] for name in (f"layers.{key}", f"layers.{key}.experts") if name in by_name]
                      for key in chunk.layers]
            # one root unit, or one per degree of a heterogeneous stage's embedding and head
            roots = [unit for unit in self.units if unit.name.split(".")[:2] == [f"chunk{index}", "root"]]
            for position, (block, units) in enumerate(zip(chunk.layers.values(), blocks)):
                after, before = blocks[position + 1 :], blocks[:position][::-1]
                done = after[0] if after else roots  # whose B is over when this block's begins
                block.register_forward_pre_hook(self._pre_forward(units, after))
                block.register_forward_hook(self._post_forward(units, before, done))
            if roots:
                chunk.register_forward_pre_hook(self._pre_forward(roots, blocks))
                chunk.register_forward_hook(self._post_forward(roots, blocks[::-1], []))
            mine = [u for units in blocks for u in units] + roots
            for unit in mine:
                for p in unit.params:
                    on_gradient(p, self._accumulated, self.units.index(unit))
            chunk.split_backward_hooks = SplitBackwardHooks(self, mine)  # Note [ZeRO-3 under a split backward]

    def use(self, units: list, upcoming: list) -> None:
        """Gather ``units`` (waiting their all-gathers) and launch the next blocks' (Note [prefetch])."""
        for unit in units:
            unit.wait()
        for following in upcoming[: self.prefetch]:
            for unit in following:
                unit.launch()
        self._peak = max(self._peak, self.gathered_param_bytes())

    def _pre_forward(self, units, after):
        def hook(module, args):
            self.use(units, [] if _in_backward() else after)
        return hook

    def _post_forward(self, units, before, done):
        def hook(module, args, output):
            if _in_backward():  # a recompute inside backward: the unit stays gathered
                return None
            for unit in units:
                unit.free()
            outputs = output if isinstance(output, tuple) else (output,)
            for tensor in outputs:
                if torch.is_tensor(tensor) and tensor.requires_grad:
                    tensor.register_hook(self._pre_backward(units, before, done))
            return None
        return hook

    def _pre_backward(self, units, before, done):
        def hook(grad):
            if self.inputs_only:  # a B pass: ``done``'s part of it is over (Note [ZeRO-3 under a split backward])
                for unit in done:
                    unit.free()
            self.use(units, before)
            return grad
        return hook

    def _accumulated(self, index: int, param) -> None:
        unit = self.units[index]
        unit.pending -= 1
        if unit.pending:
            return
        unit.pending = len(unit.params)  # this backward pass is done with the unit
        unit.passes += 1
        unit.free()
        if any(unit.early) and not (unit.late and unit.passes == self.accumulations):
            self._launch(unit, late=False)  # Note [gradients of a unit]

    # ---- Note [gradients of a unit] -------------------------------------------------

    @torch.no_grad()
    def _launch(self, unit: Unit, *, late: bool) -> None:
        """Pack the unit's gradients (``late``: all it still holds; else all but the late
        ones), free them, and start their reduce-scatter."""
        self._drain()
        packed = torch.zeros(unit.padded, dtype=torch.float32, device=self.flat.device)
        at = 0
        for p, early in zip(unit.params, unit.early):
            if p.grad is not None and (late or early):
                packed[at : at + p.numel()].copy_(p.grad.reshape(-1))
                p.grad = None  # the packed copy replaces it
            at += p.numel()
        work, mine = None, packed
        if unit.size > 1 and self.reduce_dtype is not None:  # zero.py, Note [bf16 reduction under ZeRO]
            packed = mine = packed.to(self.reduce_dtype)
        if unit.size > 1:
            comm_bytes.add("dp", packed)  # a reduce-scatter's input, as an all-reduce's (Note [comm bytes])
        if unit.size > 1 and dist.get_backend(unit.group) == "nccl":
            mine = torch.empty(unit.shard_numel, dtype=packed.dtype, device=packed.device)
            work = dist.reduce_scatter_tensor(mine, packed, group=unit.group, async_op=True)
        elif unit.size > 1:
            work = dist.all_reduce(packed, group=unit.group, async_op=True)
            rank = group_rank(unit.group)
            mine = packed[rank * unit.shard_numel : (rank + 1) * unit.shard_numel]
        self._inflight = (unit, mine, work)

    def _accumulator(self) -> torch.Tensor:
        """This step's fp32 gradient shards (Note [gradients of a unit]), zero at first."""
        if self.grad is None:
            self.grad = torch.zeros_like(self.flat)
        return self.grad

    @torch.no_grad()
    def _drain(self) -> None:
        if self._inflight is None:
            return
        unit, mine, work = self._inflight
        self._inflight = None
        if work is not None:
            with exposed():
                work.wait()
        mine = mine.to(torch.float32)  # a bf16 sum (grad_reduce) back in fp32 before the mean
        mine.div_(unit.divisor)  # dp (× replicas); experts: the dp ranks whose mean loss it is
        self._accumulator()[unit.offset : unit.offset + unit.shard_numel].add_(mine)

    @torch.no_grad()
    def reduce_gradients_and_clip(self, max_norm: float, grad_scale: float = 1.0) -> float:
        """Mean gradient over the data-parallel ranks into this rank's shards, clipped to
        ``max_norm``; returns the global norm (``zero.clip_global_norm_``)."""
        for unit in self.units:
            unit.free()
            if unit.late or unit.pending != len(unit.params):
                self._launch(unit, late=True)  # late gradients, or what a partial pass left
            unit.pending, unit.passes = len(unit.params), 0
        self._drain()
        self._accumulator()
        # HSDP: the other nodes' copies, once a step (the experts' over their own replicas)
        sum_over_replicas(self.grad, [(self.replicate_group, None), (self.edp_replicate_group, self.expert_mask)],
                          self.reduce_dtype)
        # Note [ZeRO-3 over stage replicas]: the other pipeline's copies of these stages
        sum_over_replicas(self.grad, [(self.replica_group, None)], self.reduce_dtype)
        self.gathered_peak_bytes, self._peak = self._peak, 0
        if self.layouts is not None:
            return self._stage_clip(max_norm, grad_scale)
        if self.expert_mask is None:
            return clip_global_norm_(
                self.grad, counted=self.counted, tp_mask=self.tp_mask, max_norm=max_norm,
                tp_group=self.tp_group, dp_group=self.dp_group, pp_group=self.pp_group, grad_scale=grad_scale,
                tp_share=self.tp_share,
            )
        # Note [experts as units]: the dense shards' squares over tp and dp, the experts'
        # over edp (their shards) and the other expert groups (each rank's experts, its slices of them)
        if grad_scale != 1.0:
            self.grad.mul_(1.0 / grad_scale)
        total_sq = global_squares(self.grad, counted=self.counted & ~self.expert_mask, tp_mask=self.tp_mask,
                                  tp_group=self.tp_group, dp_group=self.dp_group)
        expert_sq = self.grad[self.expert_mask].pow(2).sum()
        with exposed():
            for group in self.expert_groups:
                dist.all_reduce(expert_sq, group=group)
            total_sq = total_sq + expert_sq
            if group_size(self.pp_group) > 1:
                dist.all_reduce(total_sq, group=self.pp_group)  # every stage's squares
        return clip_to_norm_([self.grad], float(total_sq.sqrt()), max_norm)

    @torch.no_grad()
    def _stage_clip(self, max_norm: float, grad_scale: float) -> float:
        """Note [ZeRO-3 over per-layer layouts]: the global norm from each unit's squares,
        a replicated element's divided by its unit's tp (its copies in the stage)."""
        if grad_scale != 1.0:
            self.grad.mul_(1.0 / grad_scale)
        squares = self.grad.pow(2).masked_fill(~self.counted, 0.0)
        total = torch.zeros((), dtype=torch.float32, device=self.grad.device)
        for unit in self.units:
            part = slice(unit.offset, unit.offset + unit.shard_numel)
            sharded_sq, replicated_sq = sums_apart(squares[part], self.tp_mask[part])
            total += sharded_sq + replicated_sq / int(role(unit.params[0]).layer_tp)
        with exposed():
            for group in (self.stage_group, self.pp_group):
                if group_size(group) > 1:
                    dist.all_reduce(total, group=group)
        return clip_to_norm_([self.grad], float(total.sqrt()), max_norm)

    @torch.no_grad()
    def step(self) -> None:
        """AdamW on this rank's shards; the next forward gathers the new parameters."""
        if self.grad is None:
            raise RuntimeError("call reduce_gradients_and_clip() before step()")
        flat_adamw_(
            self.flat, self.grad, self.state, runs=self.decay_runs, lr=self.param_groups[0]["lr"],
            betas=(self.beta1, self.beta2), eps=self.eps, weight_decay=self.weight_decay,
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.grad = None
        for unit in self.units:
            for p in unit.params:
                p.grad = None

    def held_grad_bytes(self) -> int:
        """Bytes of the gradient shards this optimizer keeps (``param.grad`` not included)."""
        return 0 if self.grad is None else self.grad.numel() * self.grad.element_size()

    def state_bytes(self) -> int:
        """Bytes of optimizer state (moments) this rank holds."""
        return sum(t.numel() * t.element_size() for t in self.state.values() if torch.is_tensor(t))

    def resident_param_bytes(self) -> int:
        """Bytes of parameter shards this rank keeps between uses."""
        return self.flat.numel() * self.flat.element_size()

    def gathered_param_bytes(self) -> int:
        """Bytes of units gathered right now."""
        return sum(unit.nbytes() for unit in self.units if unit.gathered)


def _roots(params: list, layouts) -> list[tuple[str, list]]:
    """A chunk's parameters outside its blocks as units: one (``""``), or under per-layer
    layouts one per degree (``".tp2"``), the embedding's and the head's, each sharded
    over its own layer's dp group."""
    if not params:
        return []
    if layouts is None:
        return [("", params)]
    degrees = sorted({int(role(p).layer_tp) for p in params})
    if len(degrees) == 1:
        return [("", params)]
    return [(f".tp{t}", [p for p in params if int(role(p).layer_tp) == t]) for t in degrees]
