"""Mixture of experts in the cost model: expert compute, the ep all-to-alls, what experts add.

Takes: a ``Spec`` with experts > 0, a ``Layout`` (its ``ep``) and ``Hardware``. Gives:
``moe_block`` (the mean block's expert compute and all-to-all per micro-batch, and what
compute does not hide), ``expert_reduce`` (the experts' gradient reduction over edp) and
``moe_saved_elements`` (what a MoE block's router, experts and combine save for backward,
which ``cost/memory.py`` adds to the model description's count of the rest of the block).
The rest of a MoE block (attention, router, shared experts: linear modules) is
``cost/time.py``'s dense block, and memory is ``cost/memory.py``'s (experts sharded over
ep by ``rank_params``). Before: ``cost/layout.py``, ``cost/comm.py``. After: ``cost/time.py``,
``cost/memory.py``.

Note [MoE costs] (runtime/parallel/expert/moe.py), per MoE block and micro-batch on one rank of n local
tokens, K = top_k, C hidden, F = expert_ffn, ι = ``model.routing_imbalance`` (the busiest
ep rank's routed rows over the mean, 1.0 when dropless and balanced):
- rows: the rank dispatches n·K rows, n = micro_batch·seq_len/cp (a cp rank routes its
  own chunk: Note [MoE under context parallelism]), n/tp under ep > 1 with tp (each tp
  rank sends a share of the replicated tokens, Note [expert dispatch under tp]) and
  under sp (each tp rank routes its own sequence shard, Note [MoE under sequence
  parallelism]; once counted n, tp× too much expert compute and all-to-all); its
  experts receive as many, times ι on the busiest rank, which the others wait for
  (tests/planner/test_moe_rows.py checks the count against the runtime's, rank by rank).
- compute: the grouped GEMM of each projection (3 for llama, 2 for gpt), 2·rows·C·F FLOPs
  each, at the matmul rate of the per-expert row count (Note [size-dependent efficiency])
  times ``GROUPED_GEMM_EFFICIENCY``; the activation and the permutations (gather,
  scatter, weighting) stream their bytes (``layout.streamed_element``); each local
  expert's projection is one dispatch.
  Backward twice the forward.
- all-to-all over ep (α–β over the links the ep group spans: ep ranks etp apart among the
  stage's dp·cp·tp, ``cost/comm.py``): dispatch and combine each move the rows'
  (ep − 1)/ep leaving the rank, as an all-gather's ring does; backward the same two. Under
  tp the experts' rows are gathered back over tp (forward), their gradient split back.
- sub-batch overlap (k sub-batches) with ep > 1 (Note [expert all-to-all overlap]): sub-batch i+1's
  dispatch and i−1's combine run behind i's experts: exposed 2·a + (k − 1)·max(0, 2·a − c)
  per pass (a one sub-batch's all-to-all, c its experts' compute), backward with 2c. Without
  overlap, or with gloo on the CPU cores (``comm_on_cores``), every all-to-all is exposed.
- a model with moe_every > 1 has dense blocks between: the mean block takes the MoE share
  of the experts and the dense share of an MLP of ``ffn``.

Note [what a MoE block saves] (the MoE part of runtime/layout/saved_elements.py's Note [what
parc's trainer saves], per token, in elements; under full recompute nothing beyond the block
input): the dense MLP's F terms are replaced by the routed rows' (runtime/parallel/expert/moe.py):
r rows per token on this rank (top_k; /t under ep > 1, where each tp rank dispatches a share,
and under sp; times the routing imbalance on the busiest rank), each saving its gathered
input h and 4F_e (llama: gate, up, silu, product) or 2F_e (gpt: up, gelu) and its int64
indices (2 each: the permutation's; ep's regroup and return, etp's too), plus every token's
top_k combined rows h (eager: 2h), their weights and two int64 indices, the router's
probabilities E, sort indices 2E (the top-k slice keeps the whole int64 storage), chosen
scores K and their sum, the z-loss's logits E and log-sum-exp (the router's terms and the
combine's /t under sp, where a tp rank routes its own shard and no column linear gathers the
MLP's input); shared experts as a dense MLP of S·F_e (eager: 4 or 2 per F).
"""

from __future__ import annotations

from dataclasses import dataclass

from parc.dsl.spec import Arch, ModelSpec, Spec
from parc.runtime.layout.model_desc import LINEAR
from parc.runtime.layout.saved_elements import takes

from .comm import collective_time
from .hardware import Hardware, gemm_time
from .layout import Layout, expert_data_ranks, streamed_element
from .options import Option

OPTIONS = (
    Option(name="etp", default=1, words=lambda etp: f"etp {etp}" if etp > 1 else None,
           of_plan=lambda plan: 1 if (etp := plan.model.expert_tensor_parallel) is None else etp.value,
           of_spec=lambda par: par.etp,
           to_spec=lambda etp, par: {"etp": etp}, auto=lambda par: par.etp is None),
)
"""How expert tensor parallelism prints and reads (Note [an option is an entry], cost/options.py)."""

GROUPED_GEMM_EFFICIENCY = 0.9
"""A grouped GEMM's rate over one GEMM of the same per-expert shape (launch and tail
effects of many small problems; Megatron's grouped GEMM reaches ~90% on H100)."""


@dataclass(frozen=True, slots=True)
class MoEBlock:
    """The mean block's expert part, one micro-batch, seconds."""

    forward: float
    """Expert compute of the forward (backward: twice)."""
    exposed_forward: float
    exposed_backward: float
    moved: float
    """Every all-to-all (and tp gather) of forward and backward, hidden or not."""


NO_EXPERTS = MoEBlock(0.0, 0.0, 0.0, 0.0)


def moe_share(spec: Spec) -> float:
    """The fraction of blocks that are MoE (every ``moe_every``-th)."""
    m = spec.model
    if not m.experts:
        return 0.0
    return sum(1 for b in m.desc.blocks if b.experts) / m.layers


def routed_rows(spec: Spec, layout: Layout, tokens: float) -> float:
    """Rows this rank dispatches (and its experts receive over ep) per MoE block and
    micro-batch (Note [MoE costs]); under etp its experts run etp times as many."""
    m = spec.model
    # ``tokens``: the micro-batch's on this rank before tp (micro_batch · seq_len / cp). A tp
    # rank routes 1/tp of them under sp (its sequence shard, Note [MoE under sequence
    # parallelism]) and under ep·etp > 1 (its share, Note [expert dispatch under tp]);
    # only replicated experts without sp see every token on every tp rank.
    own = layout.sp or layout.expert_folds > 1
    dispatched = tokens / layout.tp if own else tokens
    return dispatched * m.top_k * m.routing_imbalance


def _expert_forward(spec: Spec, layout: Layout, hw: Hardware, tokens: float) -> float:
    m = spec.model
    C, F = m.hidden, (m.expert_ffn or m.ffn) / layout.etp  # this rank's slice of each expert
    rows = routed_rows(spec, layout, tokens) * layout.etp  # the etp group's rows, gathered
    local = m.experts // layout.ep
    projections = 3 if m.arch is Arch.LLAMA else 2
    per_expert = max(1.0, rows / local)
    rate = hw.matmul_flops(min(per_expert, C, F)) * GROUPED_GEMM_EFFICIENCY
    gemm = projections * 2.0 * rows * C * F / rate * hw.gemm_scale
    # activation (F per row read and written per input), permutations: gather, scatter, weigh (C per row)
    streamed = rows * (projections * F + 4 * C) * streamed_element(spec) / hw.memory_bandwidth
    ops = (projections * local + 12) * hw.op_overhead
    return gemm + streamed + ops


def _dense_mlp_forward(spec: Spec, layout: Layout, hw: Hardware, tokens: float) -> float:
    """A dense block's MLP GEMMs (the blocks between MoE ones when moe_every > 1)."""
    dense = next((b for b in spec.model.desc.blocks if not b.experts), None)
    if dense is None:
        return 0.0
    return sum(gemm_time(hw, tokens, *m.weight.local_shape(layout.tp)) for m in dense.modules
               if m.layer == LINEAR and m.kind.startswith("mlp."))


def _exposed(a: float, compute: float, k: int, comm_on_cores: bool) -> float:
    """Note [MoE costs]: one pass's exposed all-to-all time, ``a`` per sub-batch."""
    if comm_on_cores or k == 1:
        return 2 * a * k
    return 2 * a + (k - 1) * max(0.0, 2 * a - compute / k)


def moe_block(spec: Spec, layout: Layout, hw: Hardware, *, tokens: float, k: int, size: float) -> MoEBlock:
    """The mean block's expert part on ``tokens`` tokens of one micro-batch, ``k`` sub-batches
    (Note [MoE costs]); ``size`` bytes an activation element."""
    m = spec.model
    share = moe_share(spec)
    if not share:
        return NO_EXPERTS
    forward = share * _expert_forward(spec, layout, hw, tokens)
    forward += (1 - share) * _dense_mlp_forward(spec, layout, hw, tokens)
    if layout.expert_folds == 1:
        return MoEBlock(forward * hw.contention, 0.0, 0.0, 0.0)
    forward *= hw.contention
    rows = routed_rows(spec, layout, tokens)
    splits = k if k > 1 else 1
    a = 0.0
    if layout.ep > 1:
        a = collective_time(hw, "all_gather", rows / splits * m.hidden * size, size=layout.ep, stride=layout.etp)
    gather = 0.0 if layout.sp else collective_time(
        hw, "all_gather", tokens * m.top_k * m.hidden * size, size=layout.tp, stride=1)
    # Note [expert tensor parallelism]: the etp group's rows gathered, partial outputs reduce-scattered
    rows_in = rows * layout.etp  # the etp group's (every sub-batch's) rows
    etp = 0.0 if layout.etp == 1 else (
        collective_time(hw, "all_gather", rows_in * m.hidden * size, size=layout.etp, stride=1)
        + collective_time(hw, "reduce_scatter", rows_in * m.hidden * size, size=layout.etp, stride=1))
    compute = forward / share  # one MoE block's experts
    exposed_forward = share * (_exposed(a, compute, splits, hw.comm_on_cores) + gather + etp)
    exposed_backward = share * (_exposed(a, 2 * compute, splits, hw.comm_on_cores) + gather + etp)
    moved = share * (4 * a * splits + 2 * gather + 2 * etp)
    return MoEBlock(forward, exposed_forward, exposed_backward, moved)


def expert_reduce(hw: Hardware, layout: Layout, expert_elements: float, grad_size: float) -> float:
    """Seconds of the experts' gradient all-reduce over edp (hidden like dp's buckets)."""
    edp = expert_data_ranks(layout)
    if layout.expert_folds == 1 or edp == 1:
        return 0.0
    return collective_time(hw, "all_reduce", expert_elements * grad_size, size=edp, stride=layout.expert_folds)


def moe_saved_elements(
    model: ModelSpec, index: int, *, tp: int, sp: bool, recompute: str, compiled: bool = True, ep: int = 1,
    etp: int = 1,
) -> float:
    """Elements per token block ``index``'s router, experts and combine save (Note [what a MoE
    block saves]), which the model description's ``block_saved_elements`` leaves out: 0 for a
    dense block and under full recompute; the experts' activation is eager either way."""
    block = model.desc.blocks[index]
    if not block.experts or recompute == "full":
        return 0  # an int: a dense block's count (``h`` under full recompute) keeps its type
    config, imbalance = model.desc.config, model.routing_imbalance
    h, F, K, E = config.hidden, block.ffn, block.top_k, block.experts
    per_row = 4 * F if config.arch == "llama" else 2 * F
    own = 1 / tp if sp else 1  # Note [MoE under sequence parallelism]: a tp rank routes its shard
    rows = K / tp if ep * etp > 1 or sp else K  # Note [expert dispatch under tp] (moe.py)
    # Note [expert tensor parallelism]: the etp group's rows gathered, each with 1/etp of the ffn
    routed = rows * etp * imbalance * (h + per_row / etp)
    # int64 indices (2 elements a row): the permutation's, and where the ep exchange and the
    # etp gather regroup the rows arrived and send them back (moe.exchange_plan, run_local)
    indices = 2 * rows + (4 * rows * imbalance if ep > 1 else 0) + (4 * rows * etp * imbalance if etp > 1 else 0)
    # each token's top_k rows before weighting (the eager combine also keeps them weighted),
    # their weights, and two int64 indices of them (the weights' gather, the scatter-add's)
    combine = own * K * ((h if takes(compiled, "moe") else 2 * h) + 1 + 2 + 2)
    # the softmax's probabilities, the sort's int64 indices (the top-k slice keeps all E),
    # the chosen scores and their sum, the logits and log-sum-exp of the z-loss
    router = own * (E + 2 * E + K + 1 + E + 1)
    shared = config.shared_experts * per_row  # a dense MLP of S·F_e, replicated over tp
    return routed + indices + combine + router + shared
