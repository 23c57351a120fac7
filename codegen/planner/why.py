"""Why the planner's winner wins: the lines under ``parc plan``'s table.

Takes: a ``Spec``, a ``SearchResult`` and the ``Hardware``. Gives: ``why(...)``, a few
lines of text: what the winner and the runner-up differ in, which part of the step
time (compute, exposed communication, bubble) makes the difference and why, the
memory each needs, the fastest layout that does not fit, and which layout ``parc
build`` would use when the best one cannot be built yet (zero 3 with overlap).
Before: ``codegen/planner/search.py``. After: ``codegen/cli/plan.py`` (text and JSON).
"""

from __future__ import annotations

from parc.runtime.layout.constraints import PER_LAYER
from parc.runtime.layout.layer_settings import SETTINGS, fold_runs, folded, setting

from dataclasses import replace

from .cost import Accounting, Estimate, Hardware, estimate
from .cost.bubble import REASONS as SCHEDULE_REASONS
from .cost.options import options, qualified
from .cost.per_layer import hetero_supported
from .cost.layout import by_node, rank_params, zero3_spread
from .cost.time import compression_cost
from .search import EXACT_TOP, TIE_TOLERANCE, Incomplete, SearchResult, tie_memory_unit, tie_rule

KEYS = (
    ("dp", "dp"), ("cp", "cp"), ("tp", "tp"), ("pp", "pp"), ("ep", "ep"), ("sp", "sp"), ("zero", "zero"),
    *((entry.name, entry.name) for entry in options() if entry.compared),
    ("schedule", "schedule"), ("chunks", "chunks"), ("slices", "slices"), ("compress", "compress"),
    *((entry.name, entry.name) for entry in SETTINGS), ("micro_batch", "micro_batch"),
)

REASONS = {
    "compute": {
        "tp": "larger matrices per rank run closer to peak, or fewer of them",
        "pp": "the last pipeline stage runs the head on every micro-batch of its pipeline, so fewer, larger pipelines do less of it per rank",
        "zero": "the optimizer step touches a different share of the state",
        "micro_batch": "larger micro-batches run larger GEMMs with fewer op dispatches per sequence",
        "cp": "cp splits each sequence, so a rank's GEMMs keep their full width where tp would slice them",
        "ep": "each rank runs its experts' share of the routed tokens as a grouped GEMM: fewer experts per "
              "rank get more rows each",
    },
    "exposed_comm": {
        "cp": "ring attention passes K/V blocks to a neighbour behind each block's attention compute, where tp "
              "moves every layer's activations on the critical path",
        "tp": "smaller tensor-parallel groups move fewer activations per layer",
        "dp": "the gradient reduction is over a different number of ranks",
        "zero": "ZeRO's reduce + gather after backward is not hidden, zero 0's bucketed all-reduce is",
        "sp": "sequence parallelism moves the same volume as reduce-scatter + all-gather",
        "compress": "PowerSGD sends the gradients as low-rank factors (top-k its largest entries), far fewer "
                    "bytes over the dp links, but after backward instead of behind it",
        "ep": "expert parallelism sends every routed token to its expert's rank and back by all-to-all, "
              "over the links its ep group spans; the experts' gradients reduce over edp only",
    },
    "bubble": {
        "pp": "fewer pipeline stages leave less idle time at the ends of the step",
        "chunks": "interleaving shrinks the bubble by the number of chunks",
        "dp": "more micro-batches per pipeline dilute the bubble",
        "micro_batch": "smaller micro-batches mean more of them per pipeline, diluting the bubble",
    },
}
for _entry in (*SETTINGS, *options()):  # Note [a per-layer setting is an entry], [an option is an entry]
    for _term, _reason in _entry.reasons.items():
        REASONS[_term][_entry.name] = _reason
for _term, _reasons in SCHEDULE_REASONS.items():  # the schedule's and its slices', cost/bubble.py's
    REASONS[_term] |= _reasons
TERMS = (("compute", "compute"), ("exposed_comm", "exposed communication"), ("bubble", "bubble"))


def _value(key: str, value) -> str:
    """A layout field for people: a per-layer setting in the spec's words (``none``,
    an overlap's calls), a tuple of one per block with its runs folded."""
    option = next((entry for entry in options() if entry.name == key), None)
    if option is not None:
        return option.shown(value)
    word = setting(key).word if key in PER_LAYER else str
    if not isinstance(value, tuple):
        return word(value)
    return "[" + ", ".join(f"{word(v)} ×{n}" if n > 1 else word(v) for v, n in fold_runs(value)) + "]"


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"


def _seconds(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 1:
        return f"{value:+.2f} s"
    if magnitude >= 1e-3:
        return f"{value * 1e3:+.1f} ms"
    return f"{value * 1e6:+.0f} µs"


def _describe(item: Estimate) -> str:
    lay = item.layout
    cp = f" · cp {lay.cp}{qualified(lay, 'cp')}" if lay.cp > 1 else ""
    ep = f" · ep {lay.ep}" if lay.ep > 1 else ""
    dp = lay.dp if lay.layer_tp is None else folded(lay.layer_dp)
    tp = lay.tp if lay.layer_tp is None else folded(lay.layer_tp)
    text = f"dp {dp}{cp} · tp {tp}{qualified(lay, 'tp')} · pp {lay.pp}{ep}"
    extras = []
    if lay.pp > 1:
        extras.append(lay.schedule_words)
    extras += ["sp"] if lay.sp else []
    extras += [f"zero {lay.zero}"] if lay.zero else []
    extras += [f"compress {lay.compress}"] if lay.compress != "none" else []
    extras += lay.settings_words(labels="name")
    return text + (", " + ", ".join(extras) if extras else "")


def why(spec, result: SearchResult, hw: Hardware) -> list[str]:
    items = result.estimates
    if not items:
        return []
    best = items[0]
    lines = []
    if len(items) == 1 and result.considered == 1:
        lines.append(f"the spec gives its layout: {_describe(best)}.")
    layer_tp = getattr(spec.parallel, "layer_tp", None)
    if layer_tp and not hetero_supported(spec, best.layout, Accounting.PARC):  # cost/per_layer.py: one stage
        lines.append(f"per-layer tp {list(layer_tp)}: predicted as the coarse split tp {spec.parallel.tp} · "
                     f"dp {spec.parallel.dp} for every layer (the per-layer cost model covers one stage "
                     "or a pipeline of 1f1b or gpipe, without cp, experts or compression).")
    fitting = [item for item in items if item.fits]  # a bounded search's: the first of them (Incomplete past)
    if not fitting:
        if not result.complete:
            raise Incomplete
        smallest = min(items, key=lambda item: item.memory.total)
        limit = "?" if hw.memory is None else f"{hw.memory / 1e9:g} GB"
        lines.append(
            f"no layout fits: the smallest needs {_gib(smallest.memory.total)} per rank "
            f"({_describe(smallest)}) of {limit}; raise the mesh, lower micro_batch, or allow recompute."
        )
        return lines
    best = fitting[0]
    index = items.index(best) + 1
    if not result.complete and len(fitting) < min(2, result.fitting):
        raise Incomplete
    runner = fitting[1] if len(fitting) > 1 else None
    if runner is not None:
        unit = tie_memory_unit(hw)
        lines.append(_compare(best, index, runner, items.index(runner) + 1, unit))
        degrees = _degrees(best)
        other = next((item for item in fitting if _degrees(item) != degrees), None)
        if other is None and not result.complete and len(fitting) < result.fitting:
            raise Incomplete
        if other is not None and other is not runner:
            lines.append(_compare(best, index, other, items.index(other) + 1, unit, title="against other degrees"))
        lines += _cp_over_tp(best, index, result, unit)
        lines += _ep_over_replicated(best, index, result, by_node(spec))
    elif result.considered > 1:
        lines.append(f"#{index} is the only layout that fits.")
    fast = _faster_unfit(result, best)
    if fast is not None:
        limit = "" if hw.memory is None else f" > {hw.memory / 1e9:g} GB"
        lines.append(
            f"faster but out of memory: {_describe(fast)} would save "
            f"{_seconds(best.time.step - fast.time.step)[1:]} per step but needs "
            f"{_gib(fast.memory.total)} per rank{limit}."
        )
    lines += _per_layer_gain(best, index, result)
    lines += _compression(spec, best, index, hw)
    for entry in options():  # Note [an option is an entry]: its own lines, from its cost module
        if entry.why is not None and getattr(best.layout, entry.name) != entry.default:
            without = estimate(spec, replace(best.layout, **{entry.name: entry.default}), hw, exact=True)
            lines += entry.why(best, index, hw, without, _seconds)
    winner = result.winner
    if winner is not None and winner is not best:
        lines.append(
            f"#{index} ({_describe(best)}) is not one parc build can generate yet: parc build takes "
            f"#{items.index(winner) + 1} ({_describe(winner)})."
        )
    return lines


def _faster_unfit(result: SearchResult, best: Estimate) -> Estimate | None:
    """The first layout in the ranking that does not fit and is faster than ``best``, or None.
    A bounded search's places stop somewhere: a layout placed after one of step time t
    takes at least t / (1 + TIE_TOLERANCE) (Note [ranking and ties]), so once the places
    reach best · (1 + TIE_TOLERANCE) none can follow (else Incomplete)."""
    unfit = result.unfit if result.unfit is not None else [item for item in result.estimates if not item.fits]
    if result.complete:
        return next((item for item in unfit if item.time.step < best.time.step), None)
    if result.unfit is None and result.fitting < EXACT_TOP:
        raise Incomplete  # some of them were re-scored exactly (search.py): the bound below is the fast ranking's
    for item in unfit:
        if item.time.step < best.time.step:
            return item
        if item.time.step >= best.time.step * (1 + TIE_TOLERANCE):
            return None
    raise Incomplete


def _per_layer_gain(best: Estimate, index: int, result: SearchResult) -> list[str]:
    """When the winner gives its layers different degrees (Note [the per-layer dynamic
    program]): its predicted gain over the best uniform layout."""
    lay = best.layout
    if lay.layer_tp is None:  # per-layer recompute alone: the lines above compare it
        return []
    uniform = result.best_uniform
    if uniform is None:
        return [f"#{index} is per-layer ({_describe(best)}); no uniform layout fits."]
    j = result.estimates.index(uniform) + 1
    gain = uniform.time.step - best.time.step
    return [
        f"per-layer #{index} ({_describe(best)}) against the best uniform layout #{j} ({_describe(uniform)}): "
        f"a step is {_seconds(gain)[1:]} ({100 * gain / uniform.time.step:.1f}%) "
        f"{'shorter' if gain >= 0 else 'longer'} (predicted), a {uniform.time.step / best.time.step:.2f}× speedup; "
        f"memory per rank {_gib(best.memory.total)} vs {_gib(uniform.memory.total)}."
    ]


def _compression(spec, best: Estimate, index: int, hw: Hardware) -> list[str]:
    """When the winner compresses (``compress = auto``): what it buys against the same layout
    exact, and that the numerics change (cost/compress.py, Note [powersgd cost])."""
    if best.layout.compress == "none":
        return []
    exact = estimate(spec, replace(best.layout, compress="none"), hw, exact=True)
    cost = compression_cost(spec, best.layout, rank_params(spec.model, best.layout, 0)[0], hw)
    call = (f"topk(ratio = {spec.parallel.compress_ratio:g})" if best.layout.compress == "topk"
            else f"powersgd(rank = {spec.parallel.compress_rank})")
    return [
        f"#{index} compresses the dp gradients (compress = {call}): "
        f"{_gib(cost.exact_bytes)} → {_gib(cost.compressed_bytes)} per rank per step over dp "
        f"({cost.exact_bytes / cost.compressed_bytes:.1f}× fewer bytes, {_seconds(cost.compute_s)[1:]} of compression "
        f"compute), a predicted {exact.time.step / best.time.step:.2f}× speedup over the same layout exact "
        f"({_seconds(exact.time.step - best.time.step)[1:]} per step). This changes the numerics: training is "
        "no longer bitwise the one-rank run's (convergence-tested, tests/parity/test_compress.py); "
        "write compress = none to keep exact gradients."
    ]


def _degrees(item: Estimate) -> tuple[int, ...]:
    return item.layout.dp, item.layout.cp, item.layout.tp, item.layout.pp


def _cp_over_tp(best: Estimate, index: int, result: SearchResult, unit: float | None) -> list[str]:
    """What the winner's cp buys over tensor parallelism alone: the best layout with cp = 1
    (fitting or not), its step time and its activation memory per rank."""
    if best.layout.cp == 1:
        return []
    items = result.estimates
    alone = result.first(lambda item: item.layout.cp == 1)
    if alone is None:
        return [f"cp {best.layout.cp}: no layout without cp passes the rules on this mesh."]
    j = items.index(alone) + 1
    fits = "" if alone.fits else " and does not fit in memory"
    saved = alone.memory.activations - best.memory.activations
    return [
        _compare(best, index, alone, j, unit, title="against tp alone (cp 1)"),
        f"cp {best.layout.cp}{qualified(best.layout, 'cp')} over tp alone: each rank holds seq_len/{best.layout.cp} "
        f"tokens, so activations are {_gib(best.memory.activations)} vs {_gib(alone.memory.activations)} "
        f"per rank ({_gib(abs(saved))} {'less' if saved >= 0 else 'more'}); the best cp 1 layout, #{j} "
        f"({_describe(alone)}), takes {_seconds(alone.time.step - best.time.step)[1:]} "
        f"{'more' if alone.time.step >= best.time.step else 'less'} per step{fits}.",
    ]


def _ep_over_replicated(best: Estimate, index: int, result: SearchResult, hsdp: bool = False) -> list[str]:
    """What the winner's ep buys over experts replicated on every rank: the best layout
    with ep = 1 (fitting or not), its step time, its memory and exposed communication.
    ``hsdp``: ZeRO-3 shards over the ranks of a node, not every rank (``zero3_spread``)."""
    if best.layout.ep == 1:
        return []
    items = result.estimates
    alone = result.first(lambda item: item.layout.ep == 1)
    if alone is None:
        return [f"ep {best.layout.ep}: no layout with the experts replicated (ep 1) passes the rules on this mesh."]
    j = items.index(alone) + 1
    fits = "" if alone.fits else ", and does not fit in memory"
    states = lambda item: item.memory.params + item.memory.grads + item.memory.optimizer  # noqa: E731
    if best.layout.zero == 3 and alone.layout.zero == 3:  # Note [experts as units] (fsdp.py)
        over, group = zero3_spread(hsdp)
        return [
            f"ep {best.layout.ep} over replicated experts under ZeRO-3: ZeRO-3 already shards replicated experts "
            f"over {over} (states {_gib(states(best))} vs {_gib(states(alone))}), so ep buys communication "
            f"and compute, not memory: each rank gathers experts/{best.layout.ep} of every MoE layer over {group} "
            f"instead of all of them (data-parallel traffic {_seconds(best.time.dp_comm)[1:]} vs "
            f"{_seconds(alone.time.dp_comm)[1:]} per step) and runs them on the rows sent to it "
            f"(compute {_seconds(best.time.compute)[1:]} vs {_seconds(alone.time.compute)[1:]}), for "
            f"{_seconds(best.time.ep_comm)[1:]} of expert all-to-all per step; the best ep 1 layout, #{j} "
            f"({_describe(alone)}), takes {_seconds(alone.time.step - best.time.step)[1:]} "
            f"{'more' if alone.time.step >= best.time.step else 'less'} per step{fits}."
        ]
    return [
        f"ep {best.layout.ep} over replicated experts: each rank holds experts/{best.layout.ep} of every MoE "
        f"layer, so its weights, gradients and optimizer state are {_gib(states(best))} vs {_gib(states(alone))}, "
        f"for {_seconds(best.time.ep_comm)[1:]} of expert all-to-all per step; the best ep 1 layout, #{j} "
        f"({_describe(alone)}), takes {_seconds(alone.time.step - best.time.step)[1:]} "
        f"{'more' if alone.time.step >= best.time.step else 'less'} per step{fits}."
    ]


def _field(layout, key: str):
    """A layout's value of ``key``, per layer where the degrees vary (``layer_tp``, ``layer_dp``)."""
    if key in ("dp", "tp") and layout.layer_tp is not None:
        return getattr(layout, f"layer_{key}")
    return getattr(layout, key)


def _compare(best: Estimate, i: int, runner: Estimate, j: int, unit: float | None, title: str = "") -> str:
    differs = [
        (key, _field(best.layout, key), _field(runner.layout, key))
        for key, _ in KEYS
        if _field(best.layout, key) != _field(runner.layout, key)
    ]
    names = dict(KEYS)
    changed = ", ".join(f"{names[k]} {_value(k, a)} vs {_value(k, b)}" for k, a, b in differs) or "nothing"
    gap = runner.time.step - best.time.step
    share = gap / runner.time.step if runner.time.step else 0.0
    deltas = [(name, label, getattr(best.time, name) - getattr(runner.time, name)) for name, label in TERMS]
    parts = ", ".join(f"{label} {_seconds(delta)}" for _, label, delta in deltas)
    name, label, delta = min(deltas, key=lambda d: d[2])
    reason = next((REASONS[name][k] for k, _, _ in differs if k in REASONS[name]), None)
    head = f"{title}, #{i}" if title else f"why #{i}"
    memory = f"Memory per rank: {_gib(best.memory.total)} vs {_gib(runner.memory.total)}"
    if best.memory.total == runner.memory.total:
        memory += ", the same"
    slower = max(best.time.step, runner.time.step)
    if abs(gap) <= TIE_TOLERANCE * best.time.step and slower > 0:
        rule = tie_rule(best, runner, unit)
        faster = "#%d" % (i if gap >= 0 else j)
        margin = abs(gap) / slower
        margin_text = f"{margin:.2%}" if margin >= 1e-4 else "less than 0.01%"
        if margin > 1e-9:
            close = (
                f"their step times are within {TIE_TOLERANCE:.1%} ({faster} is {margin_text} faster), "
                "which the planner counts as a tie"
            )
        else:
            close = "their predicted step times are equal, a tie"
        return (
            f"{head}: it differs from #{j} ({_describe(runner)}) in {changed}; {close}, broken by "
            f"{rule or 'the faster'} (docs/planner.md). {memory}."
        )
    text = (
        f"{head}: it differs from #{j} ({_describe(runner)}) in {changed}; a step is "
        f"{_seconds(-gap)[1:]} ({share:.1%}) shorter ({parts})"
    )
    if delta < 0 and reason:
        text += f": mostly {label} — {reason}"
    return text + f". {memory}."
