"""Pipeline parallelism: run this rank's schedule over its model chunks.

Takes: the rank's chunks (``model.build_stages``), its list of actions from
``schedule.build_schedule`` and the pipeline group. Gives: ``PipelineExecutor.step``,
which runs every micro-batch's forward and backward of one optimizer step in the
schedule's order, exchanging activations and gradients with point-to-point messages;
``tied_embedding_group`` and ``allreduce_tied_grads`` for an embedding tied across the
first and last stage (or ``embedding_group``, whose one all-reduce ``dp.GradientBuckets``
folds that sum into: Note [fused embedding synchronization]); ``loss_over_pipeline`` to bring the last stage's loss to all.

Note [point-to-point on gloo]: sends are ``isend`` (they never block; the tensor is
kept alive until the step ends), receives are ``irecv`` posted ahead and waited on
right before the compute that needs them, each step's sends and receives posted as
one ``batch_isend_irecv`` (p2p.py, Note [pre-posted receives]). Messages carry a tag
naming (kind, micro-batch, the virtual stage that consumes it), so a receive matches
its send whatever the order in which they are posted; the schedules are deadlock-free
under exactly this model (``schedule.py``, checked by tests/runtime/test_schedules.py).
Where every pipeline rank is on one CPU host the same posts and waits go through shared
memory instead (``mailbox.py``, Note [pipeline messages through shared memory]), under
the same model: a send never blocks, a receive waits for its tag.

Activations travel in fp32 with the shape ``(micro_batch, T or T/tp under SP,
hidden)``, known in advance, so no shapes are exchanged.

Note [data when needed]: ``step`` takes a function that makes micro-batch m's data
(train.py's ``batch``: the same samples, ``data.sample_indices``, whenever made), not
the step's micro-batches made beforehand: the first stage's first forward then waits
for its one micro-batch instead of all of them, and every later stage waits for it.
The rest are made while the rank would block anyway: at the step's first wait on a
receive (a stage's first activation, or the first stage's first gradient, both the
schedule's bubble), every micro-batch this rank still reads is made, in the order its
computes read them. Only at that first wait: gloo reports a receive complete only once
waited on, so a later wait cannot tell whether its message is already here. A rank reads
a micro-batch where it holds the first virtual stage (tokens), the last (targets), or a
chunk whose blocks see the documents (Note [documents of a sample]); a middle stage
without documents makes none.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from ...distributed.comm import exposed, scalar_device
from ...layout.axes import coordinates, partition
from ...distributed.mesh import axis_ranks
from .mailbox import mailbox_for
from .p2p import lookahead, p2p_steps, post_batch
from ...layout.placement import Placement
from ...schedules.schedule import RECVS, SENDS, Op
from ...distributed.traffic import comm_bytes

_ACT, _GRAD = 0, 1


class PipelineExecutor:
    def __init__(
        self, chunks, *, actions, pp_group, pp_ranks, pp_rank, micro_batches,
        activation_shape, device, autocast_dtype=None, grad_codec=None, placement="interleaved", slices=None,
        loss_fn=None,
    ):
        """``pp_ranks``: the global ranks of this rank's pipeline group, by pipeline index.
        ``slices``: the token counts of each micro-batch's slices under terapipe (the
        actions' ``micro`` is then a unit, schedule_terapipe Note [slices as units]), else None.
        ``grad_codec``: the stage boundaries' gradient codec (a ``LowRankBackprop``) or None.
        ``placement``: which stage each chunk runs (``placement.py``; the schedule's
        ``placement_for``). ``loss_fn(loss, chunk)``: train.py's, called on the last stage
        with each micro-batch's mean token loss (and the chunk that computed it); its
        result is what backward starts from (docs/customize.md: a loss term)."""
        self.chunks, self.actions = list(chunks), tuple(actions)
        self.loss_fn = loss_fn
        self.group, self.pp_ranks, self.pp_rank = pp_group, tuple(pp_ranks), pp_rank
        self.stages = len(self.pp_ranks)
        self.placement = Placement(placement, self.stages, len(self.chunks))
        self.virtual_stages = self.placement.virtual_stages
        self.micro_batches = micro_batches
        # terapipe.py: each micro-batch in token slices, attending to the earlier ones' keys
        self.sliced = None
        if slices is not None:  # only a TeraPipe build ships terapipe.py
            from .terapipe import SliceState

            self.sliced = SliceState(slices)
            self.sliced.attach(self.chunks)
        self.units = micro_batches * (1 if slices is None else len(slices))
        self.shape, self.device, self.autocast_dtype = tuple(activation_shape), device, autocast_dtype
        # schedule.py, Note [B and W]: B computes the input gradient only, W the weights'
        self.split_backward = any(action.op is Op.WEIGHT for action in self.actions)
        if self.split_backward:  # only a zero-bubble build ships split_backward.py
            from .split_backward import backward_input, backward_weight, defer_linear_weights

            self._backward_input, self._backward_weight = backward_input, backward_weight
            defer_linear_weights(self.chunks)  # split_backward.py, Note [deferred linear weights]
        self.steps = p2p_steps(self.actions, lookahead(device))  # Note [pre-posted receives]
        # Note [data when needed]: the micro-batches this rank reads, in the order it reads them
        self.reads = tuple(dict.fromkeys(
            self._slice(a.micro)[0] for a in self.actions if a.op is Op.FORWARD and self._reads_data(a.chunk)))
        self.grad_codec = grad_codec
        self.loss_scale = 1.0  # fp16: the last stage's backward starts from it (loss_scale.py)
        # on one CPU host, through shared memory (mailbox.py, Note [pipeline messages through shared memory])
        peers = {a.peer for a in self.actions if a.op in SENDS or a.op in RECVS}
        numel = max(torch.Size(self.shape).numel(), grad_codec.wire_numel() if grad_codec is not None else 0)
        self.mailbox = mailbox_for(pp_group, self.pp_ranks, pp_rank, peers, numel=numel,
                                   tags=2 * self.units * self.virtual_stages, device=device)

    def _vstage(self, chunk: int) -> int:
        return self.placement.stage(self.pp_rank, chunk)

    def _reads_data(self, chunk: int) -> bool:
        """Does ``chunk`` read its micro-batches' data (Note [data when needed])?"""
        v = self._vstage(chunk)
        return v in (0, self.virtual_stages - 1) or getattr(self.chunks[chunk], "documents", None) is not None

    def _local(self, neighbour) -> int | None:
        """The chunk of a neighbouring (rank, chunk) when it is on this rank (a hand-over
        in memory, placement.py Note [placements]), else None."""
        return neighbour[1] if neighbour is not None and neighbour[0] == self.pp_rank else None

    def _compressed(self, sender: int) -> bool:
        """Does the input gradient virtual stage ``sender`` sends back travel compressed?"""
        return self.grad_codec is not None and self.grad_codec.compresses(sender)

    def _tag(self, kind: int, micro: int, consumer: int) -> int:
        return (kind * self.units + micro) * self.virtual_stages + consumer

    def _slice(self, unit: int) -> tuple[int, int | None]:
        """(micro-batch, slice) of an action's ``micro``: (micro, None) unless sliced."""
        if self.sliced is None:
            return (unit, None)
        from ...schedules.schedule_terapipe import split_unit  # a TeraPipe build ships it

        return split_unit(unit, len(self.sliced.lengths))

    def _shape(self, unit: int) -> tuple[int, ...]:
        """What travels for ``unit``: the activation shape, over the slice's tokens when sliced."""
        _, j = self._slice(unit)
        if j is None:
            return self.shape
        tokens = self.sliced.lengths[j] * self.shape[1] // sum(self.sliced.lengths)  # n/tp under sp
        return (self.shape[0], tokens, *self.shape[2:])

    def _forward_context(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _compute(self, action, batches, inputs, outputs, received, input_grads, owed):
        """Run one F, B or W; returns the scaled loss an F on the last stage computed, else 0.
        A neighbour on this rank hands over through ``received`` as a message would."""
        m, c, op = action.micro, action.chunk, action.op
        v = self._vstage(c)
        last = v == self.virtual_stages - 1
        self._use_documents(c, batches, self._slice(m)[0])
        if op is Op.FORWARD:
            micro, j = self._slice(m)
            tokens, targets = batches[micro][:2] if v == 0 or last else (None, None)  # Note [data when needed]
            scale = self.micro_batches
            if j is not None:  # terapipe: this slice's tokens; its loss weighs by its share of them
                start, length = self.sliced.starts[j], self.sliced.lengths[j]
                if tokens is not None:
                    tokens, targets = tokens[:, start : start + length], targets[:, start : start + length]
                scale = self.micro_batches * sum(self.sliced.lengths) / length
            x = tokens.to(self.device) if v == 0 else received.pop((_ACT, m, c))[1].requires_grad_(True)

            def run():
                with self._forward_context():
                    out = self.chunks[c](x, targets.to(self.device) if last else None)
                    return self.loss_fn(out, self.chunks[c]) if last and self.loss_fn is not None else out

            y = run() if j is None else self.sliced.forward(micro, j, run)
            inputs[(m, c)], outputs[(m, c)] = x, y / scale if last else y
            following = self._local(self.placement.following(self.pp_rank, c))
            if following is not None:  # as sent: detached, in fp32
                received[(_ACT, m, following)] = (None, y.detach().to(torch.float32))
            return outputs[(m, c)].detach() if last else 0.0  # on the device: no sync per micro-batch
        if op is Op.BACKWARD:
            x, y = inputs.pop((m, c)), outputs.pop((m, c))
            grad = None if last else received.pop((_GRAD, m, c))[1]
            if grad is not None and self._compressed(v + 1):
                grad = self.grad_codec.decode(grad)
            grad = None if grad is None else grad.to(y.dtype)
            if last and self.loss_scale != 1.0:
                grad = torch.full_like(y, self.loss_scale)  # d(scale · loss)/d(loss)
            if self.split_backward:  # split_backward.py, Note [hooks of a split backward]
                hooks = getattr(self.chunks[c], "split_backward_hooks", None)
                with contextlib.nullcontext() if hooks is None else hooks.inputs():
                    x_grad, owed[(m, c)] = self._backward_input(y, grad, x, self.chunks[c].parameters())
            elif self.sliced is not None:  # with the gradients later slices left on its keys and values
                self.sliced.backward(*self._slice(m), y, grad)
                x_grad = x.grad
            else:
                torch.autograd.backward(y, grad_tensors=grad)
                x_grad = x.grad
            previous = self._local(self.placement.previous(self.pp_rank, c))
            if previous is not None:
                received[(_GRAD, m, previous)] = (None, x_grad.to(torch.float32))
            elif v > 0:
                input_grads[(m, c)] = x_grad
            return 0.0
        if op is Op.WEIGHT:
            self._backward_weight(owed.pop((m, c)), getattr(self.chunks[c], "split_backward_hooks", None))
            return 0.0
        raise ValueError(f"unknown pipeline action {action!r}")

    def _use_documents(self, c: int, batches, m: int) -> None:
        """Under documents = separate (a batch's third tensor: its document ids) chunk ``c``'s
        blocks see micro-batch ``m``'s documents, in its forward and in a backward that
        recomputes it (Note [documents under recompute] in documents.py)."""
        if getattr(self.chunks[c], "documents", None) is not None:
            self.chunks[c].documents.use(batches[m][2], self.device)

    def step(self, batch) -> float:
        """Forward and backward of every micro-batch; ``batch(m)`` makes micro-batch m's
        ``(inputs, targets)``, or ``(inputs, targets, documents)`` under documents =
        separate, called once per micro-batch this rank reads (Note [data when needed]).

        Each micro-batch's loss is divided by the number of micro-batches (the mean
        over the step, as without a pipeline). Returns the sum of those scaled losses
        on the rank holding the last virtual stage, 0.0 elsewhere.
        """
        batches = _Made(batch)
        if self.mailbox is not None:
            self.mailbox.next_step()
        ahead = self.reads  # made at the first wait (Note [data when needed])
        inputs, outputs = {}, {}  # (micro, chunk) -> stage input / output (or loss)
        received, input_grads = {}, {}  # (kind, micro, chunk) -> posted receive; (micro, chunk) -> grad to send
        owed = {}  # (micro, chunk) -> what its W needs (split backward only)
        sent = []  # (Posted, tensor): kept alive until the step's end
        loss_sum = 0.0
        for step in self.steps:  # Note [pre-posted receives] (p2p.py)
            messages, keys = [], []
            for action in step.post:
                m, c, op = action.micro, action.chunk, action.op
                v, peer = self._vstage(c), self.pp_ranks[action.peer]
                if op is Op.SEND_ACT:
                    tensor = outputs[(m, c)].detach().to(torch.float32).contiguous()
                    messages.append((True, tensor, peer, self._tag(_ACT, m, v + 1)))
                    keys.append(None)
                    comm_bytes.add("pp_forward", tensor)
                elif op is Op.SEND_GRAD:
                    tensor = input_grads.pop((m, c))
                    if self._compressed(v):  # the codec's Note [compressed backpropagation]
                        tensor = self.grad_codec.encode(v, tensor, scale=self.loss_scale)
                    tensor = tensor.to(torch.float32).contiguous()
                    messages.append((True, tensor, peer, self._tag(_GRAD, m, v - 1)))
                    keys.append(None)
                    comm_bytes.add("pp_backward", tensor)
                else:
                    kind = _ACT if op is Op.RECV_ACT else _GRAD
                    shape = (self.grad_codec.wire_numel(),) if kind == _GRAD and self._compressed(v + 1) else self._shape(m)
                    tensor = torch.empty(shape, dtype=torch.float32, device=self.device)
                    messages.append((False, tensor, peer, self._tag(kind, m, v)))
                    keys.append((kind, m, c))
            posts = post_batch(messages, self.group) if self.mailbox is None else self.mailbox.post(messages)
            for key, posted, (_, tensor, _, _) in zip(keys, posts, messages):
                if key is None:
                    sent.append((posted, tensor))
                else:
                    received[key] = (posted, tensor)
            for action in step.wait:
                posted, _ = received[(_ACT if action.op is Op.RECV_ACT else _GRAD, action.micro, action.chunk)]
                for m in ahead:  # this rank would block here: the data it reads later, made now
                    batches[m]
                ahead = ()
                with exposed():  # waiting on the previous/next stage: what compute did not hide
                    posted.wait()
            if step.compute is not None:
                loss_sum = loss_sum + self._compute(step.compute, batches, inputs, outputs, received, input_grads, owed)
        with exposed():
            for posted, _ in sent:
                posted.wait()
        if inputs or outputs or received or input_grads or owed or not (self.sliced is None or self.sliced.idle()):
            raise RuntimeError(
                "internal error in the pipeline executor: the schedule left work undone "
                f"({sorted(inputs)} {sorted(received)} {sorted(input_grads)})"
            )
        return float(loss_sum)  # the step's one wait for the device


    @torch.no_grad()
    def evaluate(self, batches) -> float:
        """Forward only, of every micro-batch in order; returns the mean loss over them on
        the rank holding the last virtual stage, 0.0 elsewhere (``runtime/train/evaluate.py``).

        Each rank runs its chunks in virtual-stage order per micro-batch, receiving the
        previous stage's activation (blocking) and sending its own (``isend``, waited at
        the end), so the ranks' work is a topological order of the stage chain: no
        rank waits on one that waits on it.
        """
        last_vstage = self.virtual_stages - 1
        pending_sends, loss_sum = [], 0.0
        handed = {}  # (micro, chunk) -> activation from a chunk on this rank
        for m, (tokens, targets, *_) in enumerate(batches):
            for c in range(len(self.chunks)):
                if not self.placement.carries(c, m):  # c is not on m's pipeline (placement.py Note [placements])
                    continue
                self._use_documents(c, batches, m)
                v, line = self._vstage(c), self.placement.pipeline(c)
                if v == 0:
                    x = tokens.to(self.device)
                else:
                    x = torch.empty(self.shape, dtype=torch.float32, device=self.device)
                    source, _ = self.placement.holder(v - 1, line)
                    if source == self.pp_rank:  # handed over in memory
                        x = handed.pop((m, c))
                    else:
                        work = dist.irecv(x, src=self.pp_ranks[source], group=self.group, tag=self._tag(_ACT, m, v))
                        with exposed():
                            work.wait()
                with self._forward_context():
                    y = self.chunks[c](x, targets.to(self.device) if v == last_vstage else None)
                if v == last_vstage:
                    loss_sum = loss_sum + y.detach().to(torch.float64) / len(batches)
                else:
                    y = y.to(torch.float32).contiguous()
                    dest, chunk = self.placement.holder(v + 1, line)
                    if dest == self.pp_rank:
                        handed[(m, chunk)] = y
                        continue
                    dest = self.pp_ranks[dest]
                    pending_sends.append((dist.isend(y, dst=dest, group=self.group, tag=self._tag(_ACT, m, v + 1)), y))
        with exposed():
            for work, _ in pending_sends:
                work.wait()
        return float(loss_sum)


class _Made(dict):
    """Micro-batch m's data, made by ``make(m)`` the first time it is asked for."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, m: int):
        self[m] = self.make(m)
        return self[m]


def tied_embedding_group(grid):
    """The group of this rank's first and last pipeline stage (same dp and tp index).

    Every rank creates every such group in the same order (``new_group`` is
    collective); returns None when there is no pipeline.
    """
    if grid.size("pp") == 1:
        return None
    mine = None
    for line in _pipelines(grid):
        group = dist.new_group([line[0], line[-1]])
        if grid.rank in (line[0], line[-1]):
            mine = group
    return mine


def embedding_group(grid, *reduce_axes):
    """The first and the last stage's ranks over ``reduce_axes`` (dp, or dp and cp) that
    share this rank's other coordinates (tp): 2·dp ranks, each holding a copy of the
    tied embedding table's same shard. None off those two stages or without a pipeline.

    Note [fused embedding synchronization]: Optimus-CC's. The tied table's gradient
    wants two sums: over dp (the mean of the batch's shards, each stage's copy apart)
    and over its two copies (first and last stage). Done apart, that is the table in the
    dp all-reduce and again in ``allreduce_tied_grads``: two collectives moving it twice.
    Sums commute, so one all-reduce over the union, this group, divided by the dp size,
    gives the same mean (exact, up to the order of the additions: the parity rows hold it
    to 1e-5): ``dp.GradientBuckets(tied_group=...)`` reduces the copies there instead of
    in its dp buckets, and the separate sum is not emitted. Default wherever the tied
    gradient goes through those buckets (render_pipeline.fused_embedding_sync); ZeRO's
    reduce-scatter into shards, the compressed reductions, heterogeneous layouts and the
    placements that put the first and the last stage on one rank (a rank holding both
    copies: placement.py) keep the separate sum.
    Every rank creates every group in the same order (``new_group`` is collective).
    """
    stages = grid.size("pp")
    if stages == 1:
        return None
    mine = None
    for ranks in partition(grid.axes, ("pp", *reduce_axes)):
        ends = [r for r in ranks if coordinates(r, grid.axes)["pp"] in (0, stages - 1)]
        group = dist.new_group(ends)
        if grid.rank in ends:
            mine = group
    return mine


def _pipelines(grid):
    """Every pipeline's global ranks (by pipeline index), in the order every rank meets
    them: the groups made over them are created in the same order everywhere."""
    world = 1
    for _, size in grid.axes:
        world *= size
    for rank in range(world):
        if coordinates(rank, grid.axes)["pp"] == 0:
            yield axis_ranks(rank, grid.axes, "pp")


def replica_group(grid):
    """Chimera: the group of this rank and the rank holding the same two stages the
    other way round (pipeline ranks r and p-1-r, same dp and tp index; placement.py,
    Note [placements]). Every rank creates every such group in the same order."""
    mine = None
    for line in _pipelines(grid):
        for r in range(len(line) // 2):
            pair = [line[r], line[len(line) - 1 - r]]
            group = dist.new_group(pair)
            if grid.rank in pair:
                mine = group
    return mine


@torch.no_grad()
def allreduce_replica_grads(chunks, group) -> None:
    """Chimera: sum the gradients of each stage's two replicas (this rank's and its
    partner's in ``replica_group``), so both replicas take the same step, as one copy
    of the stage trained on every micro-batch would. Both ranks hold the same two
    stages; each flattens its chunks' gradients in stage order (``stage_index``), so
    the two buffers line up. A gradient reduction like dp's, which it commutes with."""
    chunks = sorted(chunks, key=lambda chunk: chunk.stage_index)
    params = [p for chunk in chunks for p in chunk.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    with exposed():
        dist.all_reduce(flat, group=group)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
        offset += p.numel()


@torch.no_grad()
def allreduce_tied_grads(chunks, group) -> None:
    """Sum the gradients of the embedding table's two copies (first and last stage).

    See pipeline_stages.py, Note [tied embeddings across stages]. Ranks on middle stages hold
    no copy and do nothing. A rank holding both copies (ZB-V's V puts the first and the
    last stage on rank 0: placement.py) sums them in memory and sends nothing; its
    partner in ``group`` then holds neither, or (stage replicas, after
    ``allreduce_replica_grads`` summed each copy with its replica's) both as well.
    """
    if group is None:
        return
    weights = [w for w in (chunk.tied_weight() for chunk in chunks) if w is not None]
    for weight in weights:
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
    if len(weights) == 2:
        total = weights[0].grad + weights[1].grad
        for weight in weights:
            weight.grad.copy_(total)
        return
    for weight in weights:
        comm_bytes.add("pp_embedding", weight.grad)  # Note [fused embedding synchronization]
        with exposed():
            dist.all_reduce(weight.grad, group=group)


def loss_over_pipeline(loss_sum: float, pp_group) -> float:
    """The last stage's loss on every pipeline rank (the others contribute 0)."""
    if pp_group is None:
        return float(loss_sum)
    t = torch.tensor([float(loss_sum)], dtype=torch.float64, device=scalar_device(pp_group))
    with exposed():
        dist.all_reduce(t, group=pp_group)
    return float(t.item())
