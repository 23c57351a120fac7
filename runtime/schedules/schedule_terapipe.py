"""TeraPipe (Li et al., ICML 2021): each micro-batch's sequence split into S token slices
that flow through the pipeline one after another.

Takes: pipeline stages p, micro-batches M and slices S. Gives: ``terapipe_orders(p, M,
S)``, every rank's compute order as ``(op, unit)``, ``terapipe_bound(p, r, M, S)``, rank
r's in-flight bound in slices, ``unit``/``split_unit``, the numbering of the (micro,
slice) pairs, and ``WORDS`` (``schedule.Words``). Pure Python. Before: nothing. After:
``schedule.build_schedule`` adds the sends and receives; ``pipeline.PipelineExecutor`` and
``terapipe.SliceState`` run them.

Note [slices as units]: the lists are 1F1B's over M·S *units*, unit u = m·S + j being
slice j of micro-batch m, so messages, tags and the simulator treat a unit as a
micro-batch. Two orders inside a micro-batch are the model's, not the network's:
- forwards of a micro-batch's slices run in slice order on every stage (slice j's
  attention reads the keys and values slices 0..j-1 left on this stage);
- backwards run in *reverse* slice order: slice j's backward yields the gradients of
  the keys and values of slices < j that it attended to, and slice i's backward must
  have them all (from every j > i) before it runs (``terapipe.py``, Note [gradients
  through the kept keys and values]).
Forwards go in unit order; backwards in order of micro-batch, slices from S-1 down to
0. On rank r the warm-up is 1F1B's p-r-1 units plus S-1: the last stage can start the
backward of micro-batch m only once its last slice has run forward. With units of
F/S and B/S, each rank idles (p-1)(F+B)/S per step (``terapipe_idle``; 1F1B's (p-1)(F+B)
over S), what the paper gains: a pipeline fills with a slice, not a sequence.
"""

from __future__ import annotations

import functools

from .schedule import Arg, Words

FORWARD, BACKWARD = "F", "B"
WORDS = Words(
    "each sequence pipelined in S token slices (causal models), 1f1b over the slices",
    (Arg("slices", "token slices per sequence; or a list of each slice's tokens, summing to seq_len "
         "(uneven slices, as the paper's)", each=("slice", "the tokens of one slice"),
         lengths_field="slice_lengths"),),
    fills="fills it with token slices",
)


def slice_scale(lengths) -> tuple[float, ...]:
    """Each slice's tokens over the mean slice's: the factor on its compute time that
    ``schedule_sim.simulate`` takes (linear in tokens; attention's share grows faster)."""
    lengths = tuple(lengths)
    return tuple(n * len(lengths) / sum(lengths) for n in lengths)


def unit(micro: int, slice_: int, slices: int) -> int:
    """The unit number of slice ``slice_`` of micro-batch ``micro`` (Note [slices as units])."""
    return micro * slices + slice_


def split_unit(u: int, slices: int) -> tuple[int, int]:
    """(micro, slice) of unit ``u``."""
    return divmod(u, slices)


def _warmup(stages: int, rank: int, micro_batches: int, slices: int) -> int:
    return min(stages - rank - 1 + slices - 1, micro_batches * slices)


def terapipe_bound(stages: int, rank: int, micro_batches: int, slices: int) -> int:
    """Slices with forward done and backward not yet, at most, on ``rank``: the warm-up
    plus the first steady forward, min(p - r + S - 1, M·S)."""
    return min(_warmup(stages, rank, micro_batches, slices) + 1, micro_batches * slices)


def backward_unit(k: int, slices: int) -> int:
    """The unit of the k-th backward of a rank: micro-batches in order, slices reversed."""
    micro, back = divmod(k, slices)
    return unit(micro, slices - 1 - back, slices)


@functools.lru_cache(maxsize=256)
def terapipe_orders(stages: int, micro_batches: int, slices: int) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Every rank's compute order as ``(op, unit)`` (Note [slices as units])."""
    total = micro_batches * slices
    orders = []
    for rank in range(stages):
        warmup = _warmup(stages, rank, micro_batches, slices)
        order = [(FORWARD, u) for u in range(warmup)]
        for k in range(total - warmup):
            order += [(FORWARD, warmup + k), (BACKWARD, backward_unit(k, slices))]
        order += [(BACKWARD, backward_unit(k, slices)) for k in range(total - warmup, total)]
        orders.append(tuple(order))
    return tuple(orders)


def terapipe_idle(stages: int, forward: float, backward: float, slices: int) -> float:
    """The closed-form idle time of each rank per step, for per-micro-batch times
    ``forward`` and ``backward`` split evenly over the slices: (p-1)(F+B)/S."""
    return (stages - 1) * (forward + backward) / slices


def slice_order_problems(actions, slices: int) -> list[str]:
    """The model's orders inside each micro-batch (Note [slices as units]) that a rank's
    list breaks: forwards of its slices not in slice order, backwards not in reverse."""
    problems = []
    seen: dict[tuple[str, int], int] = {}  # (op, micro) -> last slice run
    for action in actions:
        op = action.op.value
        if op not in (FORWARD, BACKWARD):
            continue
        micro, j = split_unit(action.micro, slices)
        last = seen.get((op, micro))
        expected = (0 if last is None else last + 1) if op == FORWARD else (slices - 1 if last is None else last - 1)
        if j != expected:
            problems.append(f"{op} of slice {j} of micro-batch {micro} runs where slice {expected} should "
                            f"({'slice order' if op == FORWARD else 'reverse slice order'})")
        seen[(op, micro)] = j
    return problems
