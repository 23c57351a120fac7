"""The mixture-of-experts MLP: a router, E experts run as one grouped computation, shared experts.

Takes: a ``ModelConfig`` with ``experts > 0`` (model_desc.py lists the same modules:
``mlp.router`` (E, C), ``mlp.experts.{gate,up,down}_proj`` as (E, out, in) tensors,
``mlp.shared_experts.*`` a plain MLP of shared_experts · expert_ffn). Gives: ``MoEMLP``,
which ``model.py``'s ``Block`` uses in place of the dense MLP for every ``moe_every``-th
block, and ``step_metrics``, the step's ``aux_loss``, ``z_loss`` and ``expert_tokens``
summed over ranks for train.py's log line.

Routing (the router's scores, the top-k choice and a capacity's drop ranking) is
``routing.py``'s (Note [deterministic dropless routing], Note [capacity under sequence
parallelism]).

Note [the aux loss enters the gradient, not the returned loss]: the load-balancing loss
(Switch/GShard: coeff · E · Σₑ fₑ·Pₑ, fₑ the share of routed slots expert e got, Pₑ its
mean probability) and the z-loss (coeff · mean(logsumexp(logits)²)) are taken over the
micro-batch's tokens on this rank. ``_AuxLoss`` returns the block's output unchanged and,
in backward, gives each aux loss the gradient ``loss_scale`` (1 / GRAD_ACCUM, the weight
train.py gives each micro-batch's mean loss), as Megatron's ``MoEAuxLossAutoScaler``:
the objective is the LM loss plus the aux losses on every pipeline stage without the
stages handing losses to each other. The logged ``loss`` stays the LM loss; ``aux_loss``
and ``z_loss`` are logged beside it (``step_metrics``).

Note [MoE under context parallelism]: each cp rank holds T/cp tokens of every sequence
of the micro-batch (``data.context_chunk``); routing, dispatch and the experts are per
token, so a cp rank routes its own chunk as a dp rank routes its own sequences, and the
expert folding re-reads the stage's dp·cp·tp ranks (expert_folding.py, Note [parallel folding]):
an ep group may span cp ranks, and the edp group holds the cp ranks whose experts are
the same. Two things differ from dp. The aux losses are the whole micro-batch's, as
one rank takes them: the routed counts, token count and the probabilities' sums are
summed over cp (after tp under sp: ``aux_losses``), so every cp rank holds the same
loss. And the gradients of replicated parameters are averaged over dp·cp (the LM loss
is each cp rank's mean over its T/cp tokens, the mean of those the micro-batch's),
while each cp rank's share of the aux loss's gradient is a part of a sum: the aux
losses' backward gives ``loss_scale · cp``, so the average over cp is that sum. Expert
gradients are summed over edp and divided by dp·cp (``reduce_expert_grads``), as the
dense ones. A capacity ranks the whole micro-batch under cp too (Note [capacity under
sequence parallelism]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...distributed.comm import Pending, copy_to_group, exposed, group_rank, group_size, reduce_from_group
from ...distributed.comm_async import launch_all_gather
from ...distributed.exchange import all_to_all_rows, gather_rows_from_group, gather_rows_summed, scatter_rows_summed
from ..data.zero import mean_of_group
from ...layout.roles import role, assign
from .routing import by_expert, expert_major, grouped, permuted, route


class GroupedLinear(nn.Module):
    """E experts' linear layers as one (E, out, in) weight, no bias; under expert
    parallelism this rank's E/ep of them, experts ``first`` .. ``first + E/ep − 1``; under
    expert tensor parallelism (etp > 1) this rank's 1/etp of each along ``split`` (1:
    ``out``, column-parallel gate/up; 2: ``in``, row-parallel down: Note [expert tensor
    parallelism])."""

    def __init__(self, experts: int, in_features: int, out_features: int, *, ep_size: int = 1, ep_rank: int = 0,
                 etp_size: int = 1, etp_rank: int = 0, split: int = 1):
        super().__init__()
        local = experts // ep_size
        self.first = ep_rank * local
        shape, offsets = [local, out_features, in_features], [self.first, 0, 0]
        shape[split] //= etp_size
        offsets[split] = etp_rank * shape[split]
        self.split = split
        self.weight = nn.Parameter(torch.empty(*shape))
        self.full_shape = (experts, out_features, in_features)  # param_init fills this rank's experts only
        # its gradient reduces over edp, not dp (reduce_expert_grads)
        assign(self.weight, expert_parallel=ep_size * etp_size > 1)
        self.shard_offsets = tuple(offsets)  # where this rank's box sits in the whole (checkpoints)

    fused = None  # the compiled ops (kernels.select, set by model.use_kernels); None: eager
    uses_kernels = True

    def forward(self, x, counts):
        if self.fused is not None:  # one grouped GEMM op (kernels: cpu/moe.cpp, triton_moe.py on CUDA)
            return self.fused.grouped_mm(x, self.weight, counts)
        return grouped_linear(x, self.weight, counts)


ROW_BUCKET = 16
"""Note [expert rows in buckets]: on the CPU, torch runs a bf16 (or fp16) matmul through
oneDNN, which builds a primitive for each new shape and caches it: its first call at a
shape costs several times a cached one, and each cached primitive holds memory (600
bf16 expert-sized GEMMs at random row counts: 1.4x fp32's time cold, 0.8x warm, +210 MiB
resident; bench/peer_notes.md). An expert's row count is the routing's, a new number
nearly every micro-batch, so each expert GEMM paid the cold price and the cache grew.
``bucketed_rows`` rounds each expert's rows up to a multiple of ``ROW_BUCKET`` with zero
rows (zero in, zero out through the SwiGLU/GELU MLP, and zero rows add nothing to a
weight's gradient), so the shapes repeat; the real rows are picked back after. fp32
(MKL, no per-shape primitive) and CUDA keep the exact counts."""


def bucketed_rows(x, counts):
    """(rows padded per expert, their counts, each real row's position among them) under a
    low-precision GEMM on the CPU, else None (Note [expert rows in buckets])."""
    low = (torch.bfloat16, torch.float16)
    if x.device.type != "cpu" or not (x.dtype in low or (
            torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") in low)):
        return None
    padded = (counts + ROW_BUCKET - 1) // ROW_BUCKET * ROW_BUCKET
    if torch.equal(padded, counts):
        return None
    n = x.shape[0]
    expert = torch.repeat_interleave(torch.arange(len(counts)), counts.to("cpu", torch.long), output_size=n)
    shift = (torch.cumsum(padded, 0) - padded) - (torch.cumsum(counts, 0) - counts)  # padded start − start
    real = torch.arange(n) + shift.to("cpu", torch.long)[expert]
    source = torch.full((int(padded.sum()),), n, dtype=torch.long)  # row n: the zero row
    source[real] = torch.arange(n)
    return torch.cat([x, x.new_zeros(1, x.shape[1])]).index_select(0, source), padded, real


def grouped_linear(x, weight, counts):
    """Rows of ``x`` (N, in) sorted by expert, ``counts[e]`` of them for expert e → (N, out):
    each run of rows times its expert's weight (the eager grouped GEMM)."""
    outs, start = [], 0
    for expert, count in enumerate(counts.tolist()):
        outs.append(x[start : start + count] @ weight[expert].t())
        start += count
    return torch.cat(outs) if outs else x.new_zeros(0, weight.shape[1])


class _AuxLoss(torch.autograd.Function):
    """Forward: ``x`` unchanged. Backward: ``x``'s gradient, and ``scale`` for ``aux``
    (Note [the aux loss enters the gradient, not the returned loss])."""

    @staticmethod
    def forward(ctx, x, aux, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.full((), ctx.scale, dtype=torch.float32, device=grad.device), None


@dataclass(frozen=True, slots=True)
class ExchangePlan:
    """One dispatch and its combine (Note [expert dispatch])."""

    send: list
    """Rows to each rank of the ep group."""
    receive: list
    """Rows from each rank."""
    regroup: torch.Tensor
    """Arrival order (by source, then local expert) → local-expert order."""
    back: torch.Tensor
    """Its inverse."""
    local_counts: torch.Tensor
    """Rows for each local expert."""


class MoEMLP(nn.Module):
    """Router → top_k experts (grouped) → weighted sum, plus the shared experts; (B, T, C) → (B, T, C)."""

    def __init__(self, config, dense_mlp):
        super().__init__()
        C, E, F_e = config.hidden, config.experts, config.expert_hidden
        self.ep_group = self.etp_group = None  # parallelize.experts (Note [expert tensor parallelism])
        # Note [MoE under sequence parallelism]: the tp ranks hold different tokens (parallelize.tensor)
        self.seq_group = None
        # Note [MoE under context parallelism]: so do the cp ranks (parallelize.context)
        self.context_group = None
        self.context = None  # the cp strategy: which positions a rank holds (a capacity's ranking)
        # Note [expert dispatch under tp]: with ep·etp > 1 the tp ranks (same tokens) each send a share
        self.tp_group = None
        self.llama, self.experts_count = config.arch == "llama", E
        self.top_k, self.router_kind, self.capacity = config.top_k, config.router, config.capacity_factor
        self.aux_coeff, self.z_coeff = config.aux_loss, config.z_loss
        self.per_sequence = config.aux_loss_scope == "sequence"  # Note [sequence-wise balance loss]
        # Note [auxiliary-loss-free balancing] (router_bias.py): a buffer, not trained; on the
        # CPU while the model is built on the meta device, moved with the model
        self.bias_rate = config.router_bias_update
        self.register_buffer("router_bias", torch.zeros(E, device="cpu") if self.bias_rate else None)
        self.router = nn.Linear(C, E, bias=False)
        self.experts = nn.Module()
        if self.llama:
            self.experts.gate_proj = GroupedLinear(E, C, F_e, split=1)
        self.experts.up_proj = GroupedLinear(E, C, F_e, split=1)
        self.experts.down_proj = GroupedLinear(E, F_e, C, split=2)
        self.shared_experts = None
        if config.shared_experts:
            self.shared_experts = dense_mlp(config, ffn=config.shared_experts * F_e)
        self.loss_scale = 1.0  # 1 / micro-batches of a step (set_loss_scale)
        self.slices = None  # a sliced pipeline's SliceState (Note [experts in a slice] beside it)
        self.splits = 1  # overlap of k sub-batches under ep > 1: Note [expert all-to-all overlap]
        self.reset_metrics()

    def split_experts(self, ep_group, etp_group, tp_group, sequence_parallel):
        """Note [expert tensor parallelism]: keep this rank's E/ep experts, each its 1/etp
        along the projection's split; under sp the experts' parameters that stay whole saw
        a sequence shard (tagged by the tensor transform), the split ones reduce over edp."""
        self.ep_group, self.etp_group = ep_group, etp_group
        ep, etp = group_size(ep_group), group_size(etp_group)
        if ep * etp == 1:
            return
        self.tp_group = None if sequence_parallel else tp_group  # Note [expert dispatch under tp]
        for name, whole in list(self.experts.named_children()):
            E, out_features, in_features = whole.full_shape
            split = GroupedLinear(E, in_features, out_features, split=whole.split, ep_size=ep,
                                  ep_rank=group_rank(ep_group), etp_size=etp, etp_rank=group_rank(etp_group))
            assign(split.weight, layer_tp=role(whole.weight).layer_tp)  # per-layer degrees (hetero.py)
            setattr(self.experts, name, split)

    columns = ()
    """No column-parallel projections open it: overlap.py runs a MoE block unsplit (its
    sub-batches are the expert all-to-alls', Note [expert all-to-all overlap])."""

    def reset_metrics(self):
        self.aux_sum, self.z_sum, self.forwards = 0.0, 0.0, 0
        # host-side counters, on the CPU even while the model is built on the meta device
        self.tokens = torch.zeros(self.experts_count, dtype=torch.float64, device="cpu")

    def activation(self, up, gate=None):
        return F.silu(gate) * up if self.llama else F.gelu(up, approximate="tanh")

    def run_experts(self, x, counts):
        """Tokens sorted by expert (N, C) → each through its expert (N, C), one grouped op a projection."""
        padded = bucketed_rows(x, counts)
        if padded is not None:  # Note [expert rows in buckets]
            rows, counts, real = padded
            return self.run_experts(rows, counts).index_select(0, real)
        gate = self.experts.gate_proj(x, counts) if self.llama else None
        return self.experts.down_proj(self.activation(self.experts.up_proj(x, counts), gate), counts)

    def forward(self, x):
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # (N, C)
        logits = self.router(tokens)  # (N, E)
        experts, weights, kept, probs = route(
            logits, top_k=self.top_k, router=self.router_kind, capacity_factor=self.capacity, bias=self.router_bias,
            shards=self.shards(shape, x.device) if self.capacity is not None else None,
        )
        slot_token = torch.arange(tokens.shape[0], device=x.device).repeat_interleave(self.top_k)
        slot_expert, slot_weight = experts.reshape(-1), weights.reshape(-1)
        # kept slots by expert; the metrics' counts (dropless: every slot, no mask read)
        order, every = by_expert(slot_expert, None if self.capacity is None else kept, self.experts_count)
        routed_in, order_of = tokens, [order]
        if group_size(self.tp_group) > 1:  # Note [expert dispatch under tp]
            routed_in = copy_to_group(tokens, self.tp_group)  # backward: sum the shares' input grads
            order_of = self.tp_shares(order, slot_token[order], tokens.shape[0])
            order = order_of[group_rank(self.tp_group)]
        counts = every if len(order_of) == 1 else torch.bincount(
            slot_expert.index_select(0, order), minlength=self.experts_count)
        if self.splits > 1 and group_size(self.ep_group) > 1:  # Note [expert all-to-all overlap]
            N, tp = tokens.shape[0], len(order_of)
            # every share's rows by sub-batch (each tp rank gathers the others' in their order)
            shares = [self.split_order(o, slot_token[o], N * r // tp, N * (r + 1) // tp)
                      for r, o in enumerate(order_of)]
            orders = shares[group_rank(self.tp_group)]
            y = self.run_splits(routed_in, slot_token, slot_expert, orders)
            order_of = [torch.cat(share) for share in shares]
            order = order_of[group_rank(self.tp_group)]  # y's rows: sub-batch by sub-batch
        else:
            # Note [etp counts in flight]: without ep the etp counts are known now, gathered behind the permutation
            sizes = self.launch_sizes(counts) if group_size(self.ep_group) == 1 else None
            # (kept slots, C), by expert
            y = self.dispatch_and_run(self.permute(routed_in, slot_token[order]), counts, sizes)
        if group_size(self.tp_group) > 1:  # every tp rank weighs and sums every token's rows
            y, order = gather_rows_from_group(y, self.tp_group), torch.cat(order_of)
        out = self.combine(y, slot_token[order], slot_weight[order], tokens)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x).reshape(out.shape)  # (B, T, C): under sp it gathers T
        out = out.view(shape)
        aux = self.aux_losses(logits, probs, experts, sequences=shape[0] if self.per_sequence else 1)
        self.record(aux, every)
        if aux is not None and torch.is_grad_enabled():
            # Note [MoE under context parallelism]: the router's grad is averaged over cp too
            out = _AuxLoss.apply(out, aux[0] + aux[1], self.loss_scale * group_size(self.context_group))
        return out

    def shards(self, shape, device):
        """(the sp and cp groups, each of this rank's tokens' index in one rank's micro-batch),
        or None when this rank holds whole sequences (Note [capacity under sequence parallelism])."""
        groups = [g for g in (self.seq_group, self.context_group) if group_size(g) > 1]
        if not groups:
            return None
        sequences, local = shape[0], shape[1]
        chunk, position = local, torch.arange(local)
        if group_size(self.seq_group) > 1:  # this tp rank's shard of the (cp chunk of the) sequence
            chunk = local * group_size(self.seq_group)
            position = position + group_rank(self.seq_group) * local
        T = chunk
        if self.context is not None:  # the cp chunk's tokens at their global positions (data.context_spans)
            position = self.context.positions(chunk, position.device)[position]
            T = chunk * self.context.size
        return groups, (torch.arange(sequences).unsqueeze(1) * T + position).reshape(-1).to(device)

    fused = None  # the compiled ops (kernels.select, set by model.use_kernels); None: eager
    uses_kernels = True

    def permute(self, tokens, index):
        """Rows ``tokens[index]``: each kept slot's token, by expert (a fused gather when kernels are on)."""
        if self.fused is not None:
            return self.fused.permute_rows(tokens, index)
        return tokens.index_select(0, index)

    def combine(self, y, index, weight, tokens):
        """(N, C) like ``tokens``: each token's expert rows ``y`` times their weights, summed in row order."""
        if self.fused is not None:
            return self.fused.combine_rows(y, index, weight.to(y.dtype), tokens.shape[0]).to(tokens.dtype)
        # as the kernel does: weighted and summed in fp32, rounded to the rows' dtype (bf16
        # under autocast), then the residual stream's
        acc = torch.promote_types(y.dtype, torch.float32)
        weighted = y.to(acc) * weight.to(acc).unsqueeze(1)
        out = torch.zeros(tokens.shape[0], y.shape[1], dtype=acc, device=y.device)
        return out.index_add_(0, index, weighted).to(y.dtype).to(tokens.dtype)

    def dispatch_and_run(self, x, counts, sizes=None):
        """Rows of ``x`` sorted by expert (``counts[e]`` for expert e) → their experts' outputs, same order
        (``sizes``: without ep, the etp counts' gather already started, Note [etp counts in flight]).

        Note [expert dispatch]: under expert parallelism rank r holds experts r·E/ep ..;
        the rows go to their experts' ranks by all-to-all (dispatch), arrive by source
        rank then local expert, are regrouped by local expert for the grouped op, and go
        back the same way (combine). Both all-to-alls are paired autograd functions."""
        if group_size(self.ep_group) == 1:
            return self.run_local(x, counts, sizes)
        plan = self.exchange_plan(counts)
        sizes = self.launch_sizes(plan.local_counts)  # Note [etp counts in flight]: behind the dispatch
        arrived = all_to_all_rows(x, self.ep_group, plan.send, plan.receive)  # dispatch: by source, then expert
        y = self.run_local(permuted(arrived, plan.regroup, plan.back), plan.local_counts, sizes)
        return all_to_all_rows(permuted(y, plan.back, plan.regroup), self.ep_group, plan.receive, plan.send)  # combine

    def launch_sizes(self, counts) -> Pending | None:
        """Start gathering every etp rank's per-local-expert ``counts`` (a (splits, local)
        stack for sub-batches, else (local,)): ``run_local`` waits for them (Note [etp counts
        in flight]); None without etp."""
        if group_size(self.etp_group) == 1:
            return None
        return launch_all_gather(counts.reshape(-1, counts.shape[-1]), self.etp_group, 0)

    def sizes_in_flight(self, counts: list):
        """Every sub-batch's per-local-expert ``counts`` gathered over the etp group in one
        all-gather (Note [etp counts in flight]): gives ``sizes(i)``, sub-batch i's for
        ``run_local`` (the gather waited at the first call, behind the first dispatch), None
        without etp."""
        pending, gathered = self.launch_sizes(torch.stack(counts)), []

        def sizes(i: int) -> torch.Tensor | None:
            if pending is None:
                return None
            if not gathered:  # (etp rank, sub-batch, expert)
                gathered.append(pending.wait().view(-1, len(counts), counts[0].shape[0]))
            return gathered[0][:, i]

        return sizes

    def run_local(self, x, counts, sizes: Pending | torch.Tensor | None = None):
        """Rows sorted by local expert (``counts[e]`` for local expert e) → their outputs.

        Note [expert tensor parallelism]: under etp > 1 (Megatron-Core's expert tensor
        parallel) each rank of the etp group holds 1/etp of each of its experts' FFN
        (gate/up split along their output, down along its input). The group's ranks
        gather each other's rows (all-gather of variable row counts), regroup them by
        local expert, run their slices, and reduce-scatter the partial outputs back to
        the ranks the rows came from (summed over etp, as a row-parallel projection's
        outputs are). Backward swaps the two: the input gradient is summed over etp
        and scattered, the output gradient gathered.

        Note [etp counts in flight]: the gather needs every etp rank's row counts, which
        each rank knows only once its rows are routed (after the ep dispatch's count
        exchange). ``launch_sizes`` starts their all-gather asynchronously as soon as they
        are known: before the dispatch all-to-all (ep > 1; it runs behind that exchange),
        before the rows' permutation (ep = 1), and once for all k sub-batches before the
        first dispatch (``sizes_in_flight``, for ``moe_overlap.run_overlapped``). ``sizes``: that ``Pending`` (or
        its result, the (etp rank, local expert) table); None gathers them here, blocking."""
        if group_size(self.etp_group) == 1:
            return self.run_experts(x, counts)
        if sizes is None:
            sizes = self.launch_sizes(counts)
        if isinstance(sizes, Pending):
            sizes = sizes.wait()  # (etp rank, local expert)
        rows = sizes.sum(1).tolist()
        regroup, back = expert_major(sizes)
        gathered = gather_rows_summed(x, self.etp_group, rows)  # by etp rank, then local expert
        regroup, back = regroup.to(x.device), back.to(x.device)
        partial = self.run_experts(permuted(gathered, regroup, back), sizes.sum(0))
        return scatter_rows_summed(permuted(partial, back, regroup), self.etp_group, rows)

    def tp_shares(self, order, tokens_of, N):
        """Note [expert dispatch under tp]: tp ranks hold the same tokens; under ep > 1 rank r
        of the tp group dispatches tokens N·r/tp .. N·(r+1)/tp − 1 only (each share's kept
        slots, by expert), and the experts' rows are gathered back over tp, so the router,
        the weighting and the shared experts see every token on every tp rank."""
        tp = group_size(self.tp_group)
        bounds = torch.tensor([N * r // tp for r in range(1, tp)], dtype=tokens_of.dtype, device=tokens_of.device)
        return grouped(order, torch.bucketize(tokens_of, bounds, right=True), tp)

    def split_order(self, order, tokens_of, lo, hi):
        """The kept slots ``order`` (by expert) of tokens lo .. hi − 1 regrouped by sub-batch
        (contiguous token ranges), by expert within each: a list of index tensors."""
        return grouped(order, (tokens_of - lo) * self.splits // (hi - lo), self.splits)

    def run_splits(self, tokens, slot_token, slot_expert, orders):
        from .moe_overlap import run_overlapped  # only a build that overlaps experts ships it

        counts = [torch.bincount(slot_expert.index_select(0, o), minlength=self.experts_count) for o in orders]
        ys = run_overlapped(self, [self.permute(tokens, slot_token[o]) for o in orders], counts)
        return torch.cat(ys)

    def exchange_plan(self, counts) -> "ExchangePlan":
        """Who sends whom how many rows, from this rank's per-expert ``counts`` (one blocking
        all-to-all of the counts), and the permutations between arrival and expert order."""
        ep = group_size(self.ep_group)
        local = self.experts_count // ep
        sent = counts.view(ep, local)  # (destination rank, its local expert)
        got = torch.empty_like(sent)  # (source rank, my local expert)
        with exposed():
            dist.all_to_all_single(got, sent.contiguous(), group=self.ep_group)
        regroup, back = expert_major(got)
        return ExchangePlan(send=sent.sum(1).tolist(), receive=got.sum(1).tolist(), regroup=regroup.to(counts.device),
                            back=back.to(counts.device), local_counts=got.sum(0))

    def aux_losses(self, logits, probs, experts, sequences: int = 1):
        """(load-balancing loss, z-loss), each times its coefficient; None when both are off.

        Note [MoE under sequence parallelism]: under sp a tp rank routes only its sequence
        shard of the micro-batch, but the aux losses are the whole micro-batch's, as one
        rank takes them: the routed counts and token count are summed over tp, the
        probabilities' and squared log-sum-exps' sums too (forward all-reduce, backward
        identity: each rank's tokens get their share of the gradient, and every tp rank
        holds the same loss, which ``step_metrics`` averages). Under context parallelism
        the cp ranks' sums join them (Note [MoE under context parallelism])."""
        if self.aux_coeff == 0 and self.z_coeff == 0:
            return None
        N, E = probs.shape
        groups = [g for g in (self.seq_group, self.context_group) if group_size(g) > 1]
        if self.slices is not None and self.slices.current is not None:  # a token slice: SliceState.moe_losses
            return self.slices.moe_losses(self, logits, probs, experts, sequences, groups)
        if sequences > 1:
            return self.sequence_losses(logits, probs, experts, sequences, groups)
        routed = torch.bincount(experts.reshape(-1), minlength=E).to(probs.dtype)  # before any drop
        if not groups:
            balance = self.aux_coeff * E * torch.sum(routed / (N * self.top_k) * probs.mean(0))
            z = self.z_coeff * torch.logsumexp(logits.float(), -1).square().mean()
            return balance, z
        counted = torch.cat([routed, routed.new_tensor([N])]).detach()
        sums = torch.cat([probs.sum(0), torch.logsumexp(logits.float(), -1).square().sum()[None]])
        for group in groups:  # over tp (sp), then cp: the micro-batch's tokens
            with exposed():
                dist.all_reduce(counted, group=group)
            sums = reduce_from_group(sums, group)
        routed, total = counted[:E], counted[E]
        balance = self.aux_coeff * E * torch.sum(routed / (total * self.top_k) * (sums[:E] / total))
        z = self.z_coeff * sums[E] / total
        return balance, z

    def sequence_losses(self, logits, probs, experts, S: int, groups):
        """Note [sequence-wise balance loss]: DeepSeek-V3's complementary loss, coeff · E ·
        Σₑ fₑ·Pₑ taken over each sequence's tokens (fₑ its share of the sequence's routed
        slots, Pₑ its mean normalized score there), averaged over the micro-batch's ``S``
        sequences; the rows are sequence-major, and under sp / cp each sequence's sums
        join over the ranks that split it (Note [MoE under sequence parallelism])."""
        N, E = probs.shape
        of = torch.arange(N, device=probs.device) // (N // S)  # each token's sequence
        slots = (of.repeat_interleave(self.top_k) * E + experts.reshape(-1)).detach()
        counted = torch.zeros(S * E, dtype=probs.dtype, device=probs.device).index_add_(
            0, slots, torch.ones_like(slots, dtype=probs.dtype))
        counted = torch.cat([counted, counted.new_tensor([N // S])])
        sums = torch.cat([torch.zeros(S, E, dtype=probs.dtype, device=probs.device).index_add(0, of, probs).reshape(-1),
                          torch.logsumexp(logits.float(), -1).square().sum()[None]])
        for group in groups:
            with exposed():
                dist.all_reduce(counted, group=group)
            sums = reduce_from_group(sums, group)
        total = counted[-1]  # tokens of each sequence
        routed, mean_probs = counted[:-1].view(S, E), sums[:-1].view(S, E) / total
        balance = self.aux_coeff * E * torch.sum(routed / (total * self.top_k) * mean_probs) / S
        return balance, self.z_coeff * sums[-1] / (total * S)

    def record(self, aux, counts):
        """Add this forward to the step's metrics, unless it is a recompute in backward."""
        if torch._C._current_graph_task_id() != -1:  # recomputed under activation checkpointing
            return
        self.forwards += 1
        self.tokens += counts.detach().to("cpu", torch.float64)
        if aux is not None:
            self.aux_sum += float(aux[0].detach())
            self.z_sum += float(aux[1].detach())


def reduce_expert_grads(model: nn.Module, edp_group, *, data_ranks: int, reduce_dtype=None) -> None:
    """Expert gradients (``expert_parallel``) after backward: each already sums, through the
    combine's backward, what every rank of its ep group's tokens gave it; summed over the
    edp ranks that hold the same experts (in ``reduce_dtype`` under ``train.grad_reduce =
    bf16``, as the dense gradients) and divided by the ``data_ranks`` (dp·cp) whose mean
    loss the step takes, they equal one rank's. Other gradients are dp.py's."""
    experts = [p for p in model.parameters() if role(p).expert_parallel]
    # under ZeRO, zero.py does it (Note [experts under ZeRO])
    mean_of_group(experts, edp_group, data_ranks, reduce_dtype=reduce_dtype)


def moe_blocks(model: nn.Module):
    """(block index, its ``MoEMLP``) for each MoE block this rank holds."""
    for name, module in model.named_modules():
        if isinstance(module, MoEMLP):
            yield int(name.split("layers.")[1].split(".")[0]), module


def moe_layers(model: nn.Module) -> list[MoEMLP]:
    return [m for m in model.modules() if isinstance(m, MoEMLP)]


def set_loss_scale(model: nn.Module, micro_batches: int) -> None:
    """Each micro-batch's aux losses weigh 1 / ``micro_batches``, as its LM loss does."""
    for layer in moe_layers(model):
        layer.loss_scale = 1.0 / micro_batches


def step_metrics(model: nn.Module, config, *, micro_batches: int, stage_ranks: int, replicas: int, device) -> dict:
    """This step's ``aux_loss`` (and ``z_loss`` when on): for each MoE layer the mean over
    micro-batches and data-parallel ranks, summed over the layers; ``expert_tokens``: for
    each MoE layer (``layers.i``) the tokens each expert got, summed over ranks.
    ``stage_ranks``: the ranks that hold a layer (dp·cp·tp of its pipeline stage);
    ``replicas``: those of them that route the same tokens (tp), whose copies count once.
    One sum over the world, so every pipeline stage's layers are in it: every rank calls
    it. Resets the counters."""
    index = [i for i in range(config.layers) if config.is_moe(i)]
    E = config.experts
    values = torch.zeros(2 + len(index) * E, dtype=torch.float64)
    for layer, module in moe_blocks(model):
        values[0] += module.aux_sum / micro_batches / stage_ranks
        values[1] += module.z_sum / micro_batches / stage_ranks
        row = 2 + index.index(layer) * E
        values[row : row + E] += module.tokens / replicas
        module.reset_metrics()
    if dist.is_initialized() and dist.get_world_size() > 1:
        moved = values.to(device)
        dist.all_reduce(moved)
        values = moved.cpu()
    out = {"aux_loss": float(values[0])}
    if config.z_loss:
        out["z_loss"] = float(values[1])
    out["expert_tokens"] = {
        f"layers.{layer}": [int(round(float(v))) for v in values[2 + n * E : 2 + (n + 1) * E]]
        for n, layer in enumerate(index)
    }
    return out
