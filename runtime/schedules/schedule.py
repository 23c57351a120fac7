"""Pipeline schedules as data: for every pipeline rank, its ordered list of actions.

Takes: a schedule kind (``"gpipe"``, ``"1f1b"``, ``"interleaved"``, ``"zero_bubble"``), the number of
pipeline stages (ranks of the pp group), micro-batches per step and model chunks per
rank. Gives: ``build_schedule`` (one tuple of ``Action`` per rank), ``virtual_stage``,
``in_flight_bound`` (the memory model's number), ``message_key`` (how a send finds its
receive), ``describe`` (compact text of an action) and ``words`` (a kind's ``Words``:
its call in the spec, read by ``dsl/keys/parallel.py``). Pure Python, no torch: the
executor (before: nothing; after: it runs the lists), ``schedule_sim`` (timeline,
bubble, checks), the planner and ``parc explain`` all read the same lists.

Note [the execution model]: each rank runs its list in order. Sends are non-blocking
(``isend``; they never wait), receives block until the matching send has been
executed. A message is matched by (kind, micro, consumer virtual stage), not by order.
Every receive sits right before the compute that needs it and every send right after
the compute that produced it, so a rank waits only for data it really needs: the
lists are deadlock-free iff the compute order of every rank is consistent with the
data flow, which ``schedule_sim.check_schedule`` verifies by running them.

Note [B and W]: under a split-backward kind (``SPLIT_BACKWARD``) a backward is two
computes: B takes the received output gradient and produces the input gradient to send
(the critical path back to the first stage), W computes the stage's weight gradients
later from what B left (runtime/parallel/pipeline/pipeline.py). A micro-batch is in flight from its F to
its W: the executor keeps its graph until then. Placement: ``schedule_zb``.

Note [virtual stages]: chunk c of pipeline rank r is virtual stage c·stages + r
(Megatron's numbering). Virtual stages 0 .. stages·chunks-1 are the model in order:
stage 0 (rank 0, chunk 0) embeds, the last (rank stages-1, chunk chunks-1) computes
the loss. Activations flow v → v+1 and gradients v+1 → v, so rank stages-1 chunk c
sends to rank 0 chunk c+1.
"""

from __future__ import annotations

import enum
import functools
import importlib
from dataclasses import dataclass

from ..layout.placement import Placement, placement_for

KINDS = ("gpipe", "1f1b", "interleaved", "zero_bubble", "zero_bubble_v", "chimera", "terapipe")
SPLIT_BACKWARD = ("zero_bubble", "zero_bubble_v")
"""Kinds whose backward is two actions: B (input gradient) then W (weight gradient);
elsewhere B is the whole backward (Note [B and W])."""
FIXED_CHUNKS = {"zero_bubble_v": 2, "chimera": 2}
"""Kinds that run a fixed number of model chunks per rank (ZB-V: two, in a V; chimera:
a stage of each of its two pipelines)."""
MODULES = {
    "zero_bubble": "schedule_zb", "zero_bubble_v": "schedule_zbv", "chimera": "schedule_chimera",
    "terapipe": "schedule_terapipe",
}
"""The module of this package that holds a kind's orders and bound (gpipe, 1f1b and
interleaved live here); imported when the kind is asked for, so a build ships only its
own kind's (``codegen/render.py`` ``runtime_modules`` reads this table)."""
SLICED = ("terapipe",)
"""Kinds that pipeline token slices of each micro-batch: their actions' ``micro`` is a
unit, slice j of micro-batch m being m·S + j (``schedule_terapipe``, Note [slices as units])."""
RUNS_WITH = {**dict.fromkeys(SPLIT_BACKWARD, "split_backward"), **dict.fromkeys(SLICED, "terapipe")}
"""The executor's module (runtime/parallel/pipeline/) that a kind's pipeline imports when it
runs: the backward split in two (Note [B and W]), the token slices' state
(``SliceState``); ``codegen/features.py`` ships it."""
STAGE_COSTS = ("zero_bubble_v",)
"""Kinds whose order is found from each virtual stage's own (F, B, W) costs, integers ≥ 1
(``build_schedule``'s ``costs``: the planner's, rendered into train.py; schedule_zbv, Note
[ZB-V on paper]); the others' orders do not depend on times and refuse costs."""
OWN_CLOSED_FORM = ("chimera",)
"""Kinds whose module gives the planner's closed-form makespan (``closed_makespan``); the
others' is 1F1B's over their units (codegen/planner/cost/bubble.py, Note [closed forms])."""


@dataclass(frozen=True, slots=True)
class Arg:
    """A required integer argument of a kind's call in the spec, at least ``minimum``
    (``interleaved(chunks = 2)``). ``each``: (name, doc) of one entry, where a list of
    them may stand instead, written as it is into the spec's field ``lengths_field``."""

    name: str
    doc: str
    minimum: int = 2
    each: tuple[str, str] | None = None
    lengths_field: str | None = None


@dataclass(frozen=True, slots=True)
class Words:
    """A kind's words for people: its call in the spec (``doc``, ``args``: the ``schedule``
    key of ``dsl/keys/parallel.py``, so docs/language.md, the schema and messages);
    ``fills``, how its order fills the bubble (``parc plan``'s why); ``shape``, its
    pipeline's where not one line of stages, and ``placement``, where a rank's chunks sit
    where not Megatron's c·p + r (``parc explain``)."""

    doc: str
    args: tuple[Arg, ...] = ()
    fills: str = ""
    shape: str = ""
    placement: str = ""


_WORDS = {
    "gpipe": Words("all forwards, then all backwards"),
    "1f1b": Words("one forward, one backward"),
    "interleaved": Words("1f1b over `chunks` virtual stages per rank",
                         (Arg("chunks", "virtual stages per rank"),)),
}
"""The words of the kinds this module runs; the others' are their module's ``WORDS``."""


def kind_module(kind: str):
    """The module holding ``kind``'s orders and in-flight bound (``MODULES``)."""
    return importlib.import_module(f"{__package__}.{MODULES[kind]}")


def words(kind: str) -> Words:
    """``kind``'s words for people (``Words``), from its module (``MODULES``) or this one's."""
    return kind_module(kind).WORDS if kind in MODULES else _WORDS[kind]


def chunks_for(kind: str, chunks: int = 1) -> int:
    """Model chunks per rank that ``kind`` runs: the spec's ``interleaved(chunks = v)``,
    ZB-V's two, else one. The one place the spec's pass, checks and planner ask."""
    if kind in FIXED_CHUNKS:
        return FIXED_CHUNKS[kind]
    return chunks if kind == "interleaved" else 1


class Op(enum.Enum):
    FORWARD = "F"
    BACKWARD = "B"
    WEIGHT = "W"  # the weight gradient of a backward split in two (zero_bubble); no messages
    SEND_ACT = "send_act"  # send this chunk's forward output to the next virtual stage
    RECV_ACT = "recv_act"  # receive the forward input of this chunk from the previous virtual stage
    SEND_GRAD = "send_grad"  # send the gradient of this chunk's input to the previous virtual stage
    RECV_GRAD = "recv_grad"  # receive the gradient of this chunk's output from the next virtual stage


COMPUTE = (Op.FORWARD, Op.BACKWARD, Op.WEIGHT)
SENDS = (Op.SEND_ACT, Op.SEND_GRAD)
RECVS = (Op.RECV_ACT, Op.RECV_GRAD)


@dataclass(frozen=True, slots=True)
class Action:
    op: Op
    micro: int  # micro-batch, 0 .. micro_batches-1
    chunk: int  # model chunk on THIS rank, 0 .. chunks-1 (always 0 unless interleaved)
    peer: int | None = None  # pipeline rank sent to / received from; None for F and B


def virtual_stage(rank: int, chunk: int, stages: int) -> int:
    """Megatron numbering: chunk c of pipeline rank r is virtual stage c*stages + r
    (``placement``'s interleaved placement; other placements: ``Placement.stage``)."""
    return chunk * stages + rank


def message_key(action: Action, rank: int, placement: Placement | int) -> tuple[str, int, int]:
    """(kind, micro, consumer virtual stage) of a send or receive on ``rank``: a send
    and the receive it feeds have the same key. ``placement``: the schedule's
    ``Placement``, or a number of ranks for Megatron's interleaved one."""
    if isinstance(placement, int):
        here = virtual_stage(rank, action.chunk, placement)
    else:
        here = placement.stage(rank, action.chunk)
    if action.op is Op.SEND_ACT:
        return ("act", action.micro, here + 1)
    if action.op is Op.RECV_ACT:
        return ("act", action.micro, here)
    if action.op is Op.SEND_GRAD:
        return ("grad", action.micro, here - 1)
    if action.op is Op.RECV_GRAD:
        return ("grad", action.micro, here)
    raise ValueError(f"{action.op.name} is not a send or a receive")


def _validate(kind: str, stages: int, micro_batches: int, chunks: int, slices: int = 1, costs=None) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown pipeline schedule {kind!r}; expected one of {', '.join(KINDS)}")
    if costs is not None and kind not in STAGE_COSTS:
        raise ValueError(f"{kind}'s order does not depend on the stages' costs; pass costs = None")
    if kind in SLICED and slices < 1:
        raise ValueError(f"{kind} needs slices >= 1, got slices = {slices}")
    if kind not in SLICED and slices != 1:
        raise ValueError(f"{kind} runs whole sequences, got slices = {slices}; use terapipe for token slices")
    if stages < 1:
        raise ValueError(f"a pipeline needs stages >= 1, got stages = {stages}")
    if micro_batches < 1:
        raise ValueError(f"a pipeline needs micro_batches >= 1, got micro_batches = {micro_batches}")
    if kind in SPLIT_BACKWARD and stages < 2:
        raise ValueError(f"{kind} needs stages >= 2 (one stage has no bubble to fill)")
    if kind == "chimera" and (stages < 2 or stages % 2):
        raise ValueError(f"chimera needs an even number of stages >= 2, got stages = {stages}")
    if kind in FIXED_CHUNKS:
        if chunks != FIXED_CHUNKS[kind]:
            raise ValueError(f"{kind} runs {FIXED_CHUNKS[kind]} model chunks per rank, got chunks = {chunks}")
        return
    if kind != "interleaved":
        if chunks != 1:
            raise ValueError(f"{kind} runs one model chunk per rank, got chunks = {chunks}; "
                             "use interleaved for virtual stages")
        return
    if chunks < 2:
        raise ValueError(f"interleaved needs chunks >= 2 model chunks per rank, got chunks = {chunks}; "
                         "use 1f1b for one chunk")
    if stages < 2:
        raise ValueError(f"interleaved needs stages >= 2, got stages = {stages}")
    if micro_batches % stages:
        raise ValueError(f"interleaved needs micro_batches divisible by stages (Megatron runs "
                         f"micro-batches in groups of stages): {micro_batches} % {stages} = "
                         f"{micro_batches % stages}")


class Schedule(tuple):
    """Every rank's actions (a tuple of tuples), and the ``placement`` they run on, so
    whoever reads the lists (``schedule_sim``, ``parc explain``) knows which stage each
    chunk is."""

    placement: Placement
    slices: int
    """Token slices per micro-batch (terapipe; else 1): an action's ``micro`` is a unit."""

    def __new__(cls, ranks, placement: Placement, slices: int = 1):
        self = super().__new__(cls, ranks)
        self.placement, self.slices = placement, slices
        return self


def build_schedule(kind: str, *, stages: int, micro_batches: int, chunks: int = 1, slices: int = 1,
                   costs: tuple[tuple[int, int, int], ...] | None = None) -> Schedule:
    """For every pipeline rank 0..stages-1, its ordered actions. kind: "gpipe" | "1f1b" | "interleaved".

    gpipe: all forwards in micro order, then all backwards in micro order 0..M-1 (as
    torch.distributed.pipelining's ScheduleGPipe; the order of backwards does not change
    the bubble, and micro order keeps gradient accumulation in the order of 1f1b).
    1f1b: Megatron's PipeDream-flush. interleaved: Megatron's interleaved 1F1B.
    zero_bubble: ZB-H1 of Qi et al. 2023 (``schedule_zb``), with W actions.
    zero_bubble_v: ZB-V (``schedule_zbv``), chunks = 2 in the V placement (``placement``).
    chimera: two 1F1B pipelines in opposite directions (``schedule_chimera``), chunks = 2.
    terapipe: 1F1B over the ``slices`` token slices of every micro-batch (``schedule_terapipe``);
    an action's ``micro`` is then a unit m·S + j.
    costs: (F, B, W) of each virtual stage, integers ≥ 1, for a kind that orders by them
    (``STAGE_COSTS``); None: the kind's own assumption (ZB-V: F = B = W).
    Raises ValueError on sizes the kind cannot run and on costs it does not take (``_validate``).
    """
    _validate(kind, stages, micro_batches, chunks, slices, costs)
    if kind in SLICED:
        placement = placement_for(kind, stages, chunks)
        orders = kind_module(kind).terapipe_orders(stages, micro_batches, slices)
        return Schedule(
            (tuple(_with_communication([(_ZB_OPS[op], u, 0) for op, u in orders[rank]], rank, placement))
             for rank in range(stages)),
            placement, slices,
        )
    order = {"gpipe": _gpipe_order, "1f1b": _one_f_one_b_order, "interleaved": _interleaved_order,
             "zero_bubble": _zero_bubble_order, "zero_bubble_v": _zero_bubble_v_order,
             "chimera": _chimera_order}[kind]
    if kind in STAGE_COSTS:
        order = functools.partial(order, costs=tuple(map(tuple, costs)) if costs is not None else None)
    placement = placement_for(kind, stages, chunks)
    return Schedule(
        (tuple(_with_communication(order(rank, stages, micro_batches, chunks), rank, placement))
         for rank in range(stages)),
        placement,
    )


def in_flight_bound(kind: str, *, stages: int, rank: int, micro_batches: int, chunks: int = 1,
                    slices: int = 1) -> int:
    """The most micro-batch-chunks whose forward ran but whose backward has not, on ``rank``
    (the activations it holds at once). gpipe: M·v. 1f1b: min(stages - rank, M).
    interleaved: Megatron's warm-up plus the first steady forward,
    min(2·(stages - rank - 1) + (v - 1)·stages + 1, M·v), and M·v when M = stages
    (Megatron then runs every forward first). zero_bubble: min(stages, M) on every rank,
    counted from F to W (Note [B and W]). zero_bubble_v: 2·min(stages, M) micro-batch-chunks
    (half a stage each: 1F1B's memory). chimera: each pipeline's 1F1B bound at the stage
    the rank holds of it, summed. terapipe: in slices, min(stages - rank + S - 1, M·S).
    The bound is reached by every schedule."""
    _validate(kind, stages, micro_batches, chunks, slices)
    if not 0 <= rank < stages:
        raise ValueError(f"rank {rank} is not in 0..{stages - 1}")
    total = micro_batches * chunks
    if kind == "gpipe":
        return total
    if kind == "1f1b":
        return min(stages - rank, micro_batches)
    if kind == "zero_bubble":
        return kind_module(kind).zero_bubble_bound(stages, micro_batches)
    if kind == "zero_bubble_v":
        return kind_module(kind).zero_bubble_v_bound(stages, micro_batches)
    if kind == "chimera":
        return kind_module(kind).chimera_bound(stages, rank, micro_batches)
    if kind in SLICED:
        return kind_module(kind).terapipe_bound(stages, rank, micro_batches, slices)
    return min(_interleaved_warmup(rank, stages, micro_batches, chunks) + 1, total)


# ---- compute order of one rank: (op, micro, chunk) of every F and B ------------------


def _gpipe_order(rank, stages, micro_batches, chunks):
    return [(Op.FORWARD, m, 0) for m in range(micro_batches)] + [
        (Op.BACKWARD, m, 0) for m in range(micro_batches)
    ]


def _one_f_one_b_order(rank, stages, micro_batches, chunks):
    # Warm-up: the forwards that fill the pipeline below this rank; steady: one
    # forward, one backward; cool-down: the backwards left.
    warmup = min(stages - rank - 1, micro_batches)
    order = [(Op.FORWARD, m, 0) for m in range(warmup)]
    for m in range(micro_batches - warmup):
        order += [(Op.FORWARD, warmup + m, 0), (Op.BACKWARD, m, 0)]
    order += [(Op.BACKWARD, m, 0) for m in range(micro_batches - warmup, micro_batches)]
    return order


_ZB_OPS = {"F": Op.FORWARD, "B": Op.BACKWARD, "W": Op.WEIGHT}


def _zero_bubble_order(rank, stages, micro_batches, chunks):
    return [(_ZB_OPS[op], m, 0) for op, m in kind_module("zero_bubble").zero_bubble_orders(stages, micro_batches)[rank]]


def _zero_bubble_v_order(rank, stages, micro_batches, chunks, costs=None):
    orders = kind_module("zero_bubble_v").zero_bubble_v_orders(stages, micro_batches, costs)
    return [(_ZB_OPS[op], m, c) for op, m, c in orders[rank]]


def _chimera_order(rank, stages, micro_batches, chunks):
    return [(_ZB_OPS[op], m, c) for op, m, c in kind_module("chimera").chimera_orders(stages, micro_batches)[rank]]


def _interleaved_warmup(rank, stages, micro_batches, chunks):
    # Note [interleaved warm-up] (Megatron's forward_backward_pipelining_with_interleaving):
    # before its first backward, rank r runs (v-1)·p forwards so that every chunk has
    # work in flight, plus 2·(p-r-1) to cover the round trip to the last rank and back.
    # With M = p, everything is warm-up (all forwards, then all backwards).
    total = micro_batches * chunks
    if micro_batches == stages:
        return total
    return min(2 * (stages - rank - 1) + (chunks - 1) * stages, total)


def _interleaved_order(rank, stages, micro_batches, chunks):
    # Virtual micro-batch k (0 .. M·v-1) walks micro-batches in groups of p per chunk:
    # k = 0..p-1 are micro 0..p-1 of chunk 0, the next p the same micros of chunk 1, ...;
    # after v·p the next group of p micro-batches starts. Backwards use the chunks in
    # reverse order (the last chunk holds the loss).
    group = stages * chunks

    def forward(k):
        return (Op.FORWARD, (k // group) * stages + k % stages, (k % group) // stages)

    def backward(k):
        return (Op.BACKWARD, (k // group) * stages + k % stages, chunks - 1 - (k % group) // stages)

    total = micro_batches * chunks
    warmup = _interleaved_warmup(rank, stages, micro_batches, chunks)
    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


def remote(neighbour, rank: int) -> int | None:
    """The rank of a neighbouring (rank, chunk) when it is another rank; None when there
    is no neighbour or it is on ``rank`` itself (a local hand-over, Note [placements])."""
    return None if neighbour is None or neighbour[0] == rank else neighbour[0]


def _with_communication(order, rank, placement):
    """Each compute with its receive right before and its send right after; none for a
    neighbour on the same rank (``placement``, Note [placements]): the executor hands
    that over in memory and the rank's own order keeps the data flow."""
    for op, micro, chunk in order:
        if op is Op.WEIGHT:  # local: the B before it received and sent what was needed
            yield Action(op, micro, chunk)
            continue
        before = remote(placement.previous(rank, chunk), rank)
        after = remote(placement.following(rank, chunk), rank)
        if op is Op.FORWARD:
            if before is not None:
                yield Action(Op.RECV_ACT, micro, chunk, before)
            yield Action(op, micro, chunk)
            if after is not None:
                yield Action(Op.SEND_ACT, micro, chunk, after)
        else:
            if after is not None:
                yield Action(Op.RECV_GRAD, micro, chunk, after)
            yield Action(op, micro, chunk)
            if before is not None:
                yield Action(Op.SEND_GRAD, micro, chunk, before)


# ---- text -------------------------------------------------------------------------

_SHORT = {Op.SEND_ACT: "sa", Op.RECV_ACT: "ra", Op.SEND_GRAD: "sg", Op.RECV_GRAD: "rg"}


def describe(action: Action, chunks: int = 1) -> str:
    """Compact text: ``F3``, ``B3``; ``ra3<0`` (receive activation of micro 3 from rank
    0), ``sa3>2``, ``rg3<2``, ``sg3>0``. With chunks > 1 the chunk follows the micro:
    ``F3.1``, ``sa3.1>0``."""
    name = f"{action.micro}.{action.chunk}" if chunks > 1 else f"{action.micro}"
    if action.op in COMPUTE:
        return f"{action.op.value}{name}"
    arrow = ">" if action.op in SENDS else "<"
    return f"{_SHORT[action.op]}{name}{arrow}{action.peer}"
