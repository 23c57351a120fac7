"""One layer of a heterogeneous layout under a setting, the reshards between layers, and a
heterogeneous layout's whole estimate.

Takes: a ``Spec``, a ``Stage`` (the ranks of a stage, the coarse tp, the coarse
micro-batch, sp) and ``Hardware``. Gives: ``layer_cost`` (one block at tp t with its
recompute and overlap: seconds per step and bytes per rank), ``transition_cost`` (the
reshard between a layer at tp a and one at tp b, per step), ``ends`` (what the
embedding and the head add at their degrees) and ``hetero_estimate`` (an ``Estimate``
of a layout with ``Layout.layer_tp``). Before: ``cost/time.py``, ``cost/memory.py``.
After: ``cost/estimate.py``, ``codegen/planner/per_layer.py`` (the dynamic program).

Note [per-layer layout costs]: a stage of S ranks runs layer i as dp_i × tp_i, dp_i =
S / tp_i (runtime/parallel/data/hetero.py, Note [heterogeneous layouts]); a rank of layer i works on
micro_batch · tp_i / tp sequences (its piece of the coarse micro-batch). So layer i
costs what one block of the *uniform* layout U(tp_i) = (dp_i, tp_i, micro_batch ·
tp_i / tp) costs — its forward, backward, recompute and tp collectives
(``time.block_costs``), its gradient all-reduce over dp_i (exposed whole when gloo runs
on the compute cores, else what its own backward does not hide) and its optimizer
pass; in memory its parameters, gradients, AdamW state, flat gradient buffer and saved
activations (``memory.block_bytes``). A change of degree adds the all-gathers of
``reshard.reshard_steps`` (Note [reshard traffic]), on the critical path. Everything
else — the head at the head's degree, the embedding, the scalars — is the uniform
layout U(t_head)'s step less its blocks (``ends``), with the untied embedding's state
at its own degree (block 0's). A heterogeneous layout all of whose layers agree is
thus costed exactly as the uniform one. The model here is one stage's; under a pipeline
``cost/per_stage.py`` composes the stages (Note [per-layer layouts over a pipeline]).

Note [per-layer ZeRO]: the runtime keeps one ZeRO part per degree, each sharding its
layers' flat buffer over that degree's dp group (runtime/parallel/data/hetero.py, Note [ZeRO over
per-layer layouts]; ZeRO-3 in runtime/parallel/data/fsdp.py as it lands). So layer i at tp t, dp_i =
S/t, holds under ZeRO 1 its moments' slice 8·⌈n/dp_i⌉, under 2 also its gradients'
4·⌈n/dp_i⌉, under 3 its parameters' 4·⌈n/dp_i⌉ too (``memory.model_state_bytes`` per
layer); in time its optimizer pass streams the slice, ZeRO 1/2 add the all-gather of the
updated slice over dp_i (exposed), ZeRO 3 reduce-scatters the gradient over dp_i every
micro-batch (each behind that micro-batch's backward) and gathers the block for every micro-batch's forward and backward, the gather hidden behind
the previous block's compute as far as it goes (exposed max(0, g − c) a pass; all of it
when gloo runs on the compute cores). What is the rank's, not a layer's — ZeRO-2's two
buckets in flight, ZeRO-3's gathered working set, the first gather of each pass, the
padding of each part — is U(t)'s, in the ends: agreeing layers cost the uniform layout.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from parc.dsl.spec import Precision, Spec
from parc.runtime.layout.reshard import reshard_steps, step_group

from .comm import collective_time
from .hardware import Hardware
from .layout import SETTING_NAMES, Accounting, Layout
from .memory import (
    MemoryBreakdown, MemoryEstimate, _in_flight, autocast_block_weights, compiled_kernels, memory, model_state_bytes,
    parc_layer_elements,
)
from .time import (
    TimeBreakdown, _activation_size, _grad_reduce_element, _zero3_gather_element, block_costs, step_time,
)
from .optimizer import optimizer_time
from .zero3 import zero3_gathers


def _memo(fn):
    """Memoize ``fn(spec, stage, hw, *args)`` by identity of the spec and the hardware (a
    profiled ``Hardware`` holds dicts and does not hash); the cache keeps them alive."""
    cache: dict = {}

    @functools.wraps(fn)
    def wrapper(spec, stage, hw, *args):
        key = (id(spec), id(hw), stage, args)
        hit = cache.get(key)
        if hit is not None and hit[0] is spec and hit[1] is hw:
            return hit[2]
        value = fn(spec, stage, hw, *args)
        if len(cache) >= 8192:
            cache.clear()
        cache[key] = (spec, hw, value)
        return value

    return wrapper


@dataclass(frozen=True, slots=True)
class Stage:
    """A stage's coarse split (the largest tp of its layers) and what every layer shares."""

    ranks: int
    tp: int
    micro_batch: int
    """Sequences of one coarse replica's micro-batch."""
    sp: bool
    zero: int = 0
    """The ZeRO stage every layer uses, each over its own dp group (Note [per-layer ZeRO])."""
    pp: int = 1
    schedule: str = "1f1b"
    """The pipeline's (``1f1b`` or ``gpipe``; one chunk a rank): ``cost/per_stage.py``."""


@dataclass(frozen=True, slots=True)
class Cost:
    """Seconds per step (compute, exposed communication, tp and dp volume) and bytes per rank."""

    compute: float = 0.0
    exposed: float = 0.0
    tp_comm: float = 0.0
    dp_comm: float = 0.0
    memory: MemoryBreakdown = MemoryBreakdown(params=0.0, grads=0.0, optimizer=0.0, activations=0.0, buffers=0.0)
    forward: float = 0.0
    backward: float = 0.0
    """Seconds of one micro-batch's forward and backward on the critical path (compute and
    exposed tp collectives, reshards): what a pipeline stage's schedule runs (``per_stage.py``)."""

    @property
    def time(self) -> float:
        return self.compute + self.exposed

    def post(self, steps: int) -> float:
        """Seconds per step outside the micro-batches' critical path: the gradient
        reduction's exposed part, ZeRO's gathers, the optimizer pass."""
        return self.time - steps * (self.forward + self.backward)

    def __add__(self, other: "Cost") -> "Cost":
        m, n = self.memory, other.memory
        return Cost(
            self.compute + other.compute, self.exposed + other.exposed, self.tp_comm + other.tp_comm,
            self.dp_comm + other.dp_comm,
            MemoryBreakdown(params=m.params + n.params, grads=m.grads + n.grads, optimizer=m.optimizer + n.optimizer,
                            activations=m.activations + n.activations, buffers=m.buffers + n.buffers),
            self.forward + other.forward, self.backward + other.backward,
        )

    def scaled(self, k: float) -> "Cost":
        m = self.memory
        return Cost(self.compute * k, self.exposed * k, self.tp_comm * k, self.dp_comm * k,
                    MemoryBreakdown(params=m.params * k, grads=m.grads * k, optimizer=m.optimizer * k,
                                    activations=m.activations * k, buffers=m.buffers * k),
                    self.forward * k, self.backward * k)


def uniform(stage: Stage, t: int, settings: tuple = ("none", 1)) -> Layout:
    """U(t): the uniform layout whose one block costs what a layer at tp ``t`` does."""
    values = dict(zip(SETTING_NAMES, settings))
    dp = stage.ranks // t
    return Layout(dp=dp, tp=t, pp=stage.pp, sp=stage.sp and t > 1, zero=stage.zero if dp > 1 else 0,
                  schedule=stage.schedule, chunks=1, micro_batch=stage.micro_batch * t // stage.tp, **values)


def micro_batches(spec: Spec, stage: Stage) -> int:
    return spec.train.global_batch // (stage.micro_batch * (stage.ranks // stage.tp))


@_memo
def layer_cost(spec: Spec, stage: Stage, hw: Hardware, t: int, settings: tuple, rank: int = 0) -> Cost:
    """Note [per-layer layout costs]: one block at tp ``t`` with per-layer ``settings``
    (``SETTING_NAMES`` order), per step, on pipeline rank ``rank`` (its micro-batches in
    flight). Its memory leaves out the working set of a fully recomputed block, which only
    the largest one needs (``working_set``). Note [per-layer ZeRO]."""
    layout = uniform(stage, t, settings)
    m = spec.model
    forward, backward, tp_f, tp_b, exp_f, exp_b, _ = block_costs(
        spec, layout, hw, Accounting.PARC, settings, layers_per_chunk=m.layers // stage.pp)
    steps = micro_batches(spec, stage)
    block = m.desc.stage_params(t, layers=(0, 1), first=False, last=False)
    dp, zero, n = layout.dp, layout.zero, block.elements
    reduce = collective_time(hw, "reduce_scatter" if zero >= 3 else "all_reduce",
                             _grad_reduce_element(spec, Accounting.PARC) * n, size=dp, stride=t)
    hidden = 0.0 if hw.comm_on_cores else backward  # the last micro-batch's backward hides it
    if zero >= 3:  # every micro-batch's, each behind its own backward (runtime/parallel/data/fsdp.py, Note [gradients of a unit])
        reduce, hidden = steps * reduce, steps * hidden
    gather = collective_time(hw, "all_gather", 4.0 * n, size=dp, stride=t) if 1 <= zero <= 2 else 0.0
    # one micro-batch's gathers of this unit (its reduce-scatter is ``reduce`` above)
    gathers = zero3_gathers(hw, layout, n, 1.0, forward, backward, Accounting.PARC, micro_batches=1,
                            gather_element=_zero3_gather_element(spec, Accounting.PARC),
                            grad_element=0.0) if zero >= 3 else None
    # one unit of many: prefetch hides its gathers behind the previous block (the first one of
    # a pass, never hidden, is what the uniform layout's ends keep: Note [per-layer ZeRO])
    unit = 0.0 if gathers is None else (gathers.total if hw.comm_on_cores else sum(
        max(0.0, gathers.total / 2 - c) for c in (forward, backward)))
    optimizer = optimizer_time(spec, hw, Accounting.PARC, n, block.tensors, layout, whole_step=False) * hw.contention
    mode = dict(zip(SETTING_NAMES, settings))["recompute"]
    return Cost(
        compute=steps * (forward + backward) + optimizer,
        exposed=steps * (exp_f + exp_b + unit) + max(0.0, reduce - hidden) + gather,
        tp_comm=steps * (tp_f + tp_b),
        dp_comm=reduce + gather + (0.0 if gathers is None else steps * gathers.total),
        memory=block_bytes(spec, layout, n, block.tensors, mode, in_flight(spec, stage, rank)),
        forward=forward + exp_f, backward=backward + exp_b,
    )


def in_flight(spec: Spec, stage: Stage, rank: int) -> float:
    """Micro-batches whose activations pipeline rank ``rank`` holds at once (1 without a pipeline)."""
    return _in_flight(stage.schedule, stage.pp, rank, micro_batches(spec, stage), 1)


def block_bytes(spec: Spec, layout: Layout, elements: int, tensors: int, recompute: str,
                flight: float = 1.0) -> MemoryBreakdown:
    """One block's share of a rank's memory under ``layout`` (PARC accounting, ``flight``
    micro-batches in flight): Note [what parc's trainer holds] in ``cost/memory.py``; under
    ZeRO its state sharded over the layer's own dp group (Note [per-layer ZeRO])."""
    m = spec.model
    element = 4.0 if spec.train.precision is Precision.FP32 else 2.0
    saved = parc_layer_elements(m, tp=layout.tp, sp=layout.sp, recompute=recompute, micro_batch=layout.micro_batch,
                                compiled=compiled_kernels(spec))
    activations = saved * layout.tokens(m.seq_len) * element
    if element == 2.0 and recompute != "full":  # Note [autocast's weight copies]
        activations += 2.0 * autocast_block_weights(m, layout.tp)
    params, grads, optimizer = model_state_bytes(elements, tensors, dp=layout.dp, zero=layout.zero,
                                                 accounting=Accounting.PARC)
    # zero 0's packed buckets and zero 1's flat gradient per element; zero 2's two buckets
    # and zero 3's gathered units are the rank's, not a layer's: its ends keep them
    flat = 4.0 * elements if layout.dp > 1 and layout.zero <= 1 else 0.0
    return MemoryBreakdown(params=params, grads=grads, optimizer=optimizer, activations=activations * flight,
                           buffers=flat)


def working_set(spec: Spec, stage: Stage, t: int) -> float:
    """Bytes of a fully recomputed block at tp ``t`` rebuilt during its backward (``cost/memory.py``'s buffers)."""
    layout = uniform(stage, t)
    elements = parc_layer_elements(spec.model, tp=t, sp=layout.sp, recompute="none", micro_batch=layout.micro_batch)
    return elements * layout.tokens(spec.model.seq_len) * 4.0


@_memo
def transition_cost(spec: Spec, stage: Stage, hw: Hardware, a: int, b: int) -> Cost:
    """Note [reshard traffic] (runtime/layout/reshard.py): the all-gathers of ``reshard_steps(a, b)``
    for every micro-batch of a step, each on the critical path. A rank at tp ``a`` holds
    a/tp of the coarse micro-batch (1/a of the sequence under sp); a gather multiplies
    its share along its dim by the group's size, a scatter divides it, and the all-gather
    (forward for a gather, backward for a scatter) moves the larger of the two."""
    if a == b:
        return Cost()
    m = spec.model
    coarse = stage.micro_batch * m.seq_len * m.hidden * _activation_size(spec, Accounting.PARC)
    share = {0: a / stage.tp, 1: 1.0 / a if stage.sp and a > 1 else 1.0}
    total = 0.0
    for op, group, dim in reshard_steps(a, b, sequence_parallel=stage.sp):
        ranks, stride = step_group(group)
        before = share[0] * share[1]
        share[dim] = share[dim] * ranks if op == "gather" else share[dim] / ranks
        gathered = coarse * max(before, share[0] * share[1])
        total += collective_time(hw, "all_gather", gathered, size=ranks, stride=stride)
    total *= micro_batches(spec, stage)
    return Cost(exposed=total, tp_comm=total)


@_memo
def _uniform_estimate(spec: Spec, stage: Stage, hw: Hardware, t: int):
    layout = uniform(stage, t)
    return step_time(spec, layout, hw, Accounting.PARC, exact=False), memory(spec, layout, Accounting.PARC).peak


@_memo
def head_cost(spec: Spec, stage: Stage, hw: Hardware, t: int) -> Cost:
    """Note [per-layer layout costs]: everything but the blocks when the head (and, here,
    the embedding) run at tp ``t``: U(t)'s step and memory less ``layers`` of its blocks."""
    time, mem = _uniform_estimate(spec, stage, hw, t)
    whole = Cost(compute=time.compute, exposed=time.exposed_comm + time.bubble, tp_comm=time.tp_comm,
                 dp_comm=time.dp_comm, memory=mem)
    return whole + layer_cost(spec, stage, hw, t, ("none", 1)).scaled(-spec.model.layers)


@_memo
def embedding_cost(spec: Spec, stage: Stage, hw: Hardware, t: int) -> Cost:
    """An untied embedding table's state at tp ``t`` (its gradient reduction, optimizer
    pass, bytes); ``ends`` swaps the head's degree for block 0's with it. Zero when tied:
    the head shares the table and its degree (runtime/parallel/data/hetero.py)."""
    m = spec.model
    if m.tie_embeddings:
        return Cost()
    desc = m.desc
    table = desc.stage_params(t, layers=(0, 0), first=True, last=False)
    layout = uniform(stage, t)
    n, zero = table.elements, layout.zero
    reduce = collective_time(hw, "reduce_scatter" if zero >= 3 else "all_reduce", 4.0 * n, size=layout.dp, stride=t)
    gather = collective_time(hw, "all_gather", 4.0 * n, size=layout.dp, stride=t) if 1 <= zero <= 2 else 0.0
    optimizer = optimizer_time(spec, hw, Accounting.PARC, n, table.tensors, layout, whole_step=False) * hw.contention
    mem = block_bytes(spec, replace(layout, micro_batch=0), n, table.tensors, "full")
    return Cost(compute=optimizer, exposed=(reduce if hw.comm_on_cores else 0.0) + gather, dp_comm=reduce + gather,
                memory=replace(mem, activations=0.0))


def ends(spec: Spec, stage: Stage, hw: Hardware, first: int, last: int) -> Cost:
    """What is not a block, for block 0 at tp ``first`` and block L-1 at ``last``: the head at
    its degree (``last``; tied: ``first``, after a reshard from ``last``), the untied
    embedding at ``first``."""
    if spec.model.tie_embeddings:
        return head_cost(spec, stage, hw, first) + transition_cost(spec, stage, hw, last, first)
    swap = embedding_cost(spec, stage, hw, first) + embedding_cost(spec, stage, hw, last).scaled(-1)
    return head_cost(spec, stage, hw, last) + swap


def stage_of(layout: Layout) -> Stage:
    return Stage(ranks=layout.dp * layout.tp, tp=layout.tp, micro_batch=layout.micro_batch, sp=layout.sp,
                 zero=layout.zero, pp=layout.pp, schedule=layout.schedule if layout.pp > 1 else "1f1b")


def layout_cost(spec: Spec, layout: Layout, hw: Hardware) -> Cost:
    """The whole step of a heterogeneous ``layout`` (Note [per-layer layout costs]): its
    layers, the reshards between them, its ends and the largest full-recompute working set."""
    stage = stage_of(layout)
    tps = layout.layer_tp
    settings = layout.block_settings(spec.model.layers)
    total = ends(spec, stage, hw, tps[0], tps[-1])
    largest = 0.0
    for i, (t, setting) in enumerate(zip(tps, settings)):
        total += layer_cost(spec, stage, hw, t, setting)
        if i:
            total += transition_cost(spec, stage, hw, tps[i - 1], t)
        if dict(zip(SETTING_NAMES, setting))["recompute"] == "full":
            largest = max(largest, working_set(spec, stage, t))
    return total + Cost(memory=MemoryBreakdown(params=0.0, grads=0.0, optimizer=0.0, activations=0.0,
                                               buffers=largest))


def hetero_time_memory(spec: Spec, layout: Layout, hw: Hardware):
    """``layout_cost`` as the time breakdown and memory an ``Estimate`` carries (pp = 1: no
    bubble; under a pipeline ``estimate`` asks ``per_stage.pipeline_time_memory``, which
    builds on this module)."""
    cost = layout_cost(spec, layout, hw)
    reference, _ = _uniform_estimate(spec, stage_of(layout), hw, layout.tp)
    step = cost.time
    return replace(reference, step=step, compute=cost.compute, exposed_comm=cost.exposed, bubble=0.0,
                   tp_comm=cost.tp_comm, dp_comm=cost.dp_comm), MemoryEstimate(per_rank=(cost.memory,), peak_rank=0)


def hetero_supported(spec: Spec, layout: Layout, accounting: Accounting) -> bool:
    """What this cost model covers: PARC accounting, one stage or a pipeline of one chunk a
    rank (1f1b, gpipe: ``per_stage.py``), any ZeRO stage, none of cp, ep, compression."""
    return (accounting is Accounting.PARC and layout.cp == 1 and layout.ep == 1 and layout.compress == "none"
            and not spec.model.experts and (layout.pp == 1 or (layout.chunks == 1 and layout.schedule in PIPELINED)))


PIPELINED = ("1f1b", "gpipe")
"""The schedules a heterogeneous pipeline runs (runtime/layout/constraints/, PAR0254)."""
