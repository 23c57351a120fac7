"""Semantic checks: what the schema cannot say about a spec.

Takes: the normalized document (``dsl/normalize.py``) and the paths already found
bad. Gives: a list of (path, ParcError), each message the formula with its values
filled in ("world size: dp·tp·pp = 2·3·1 = 6 ..."). A check whose inputs are
``auto``, missing or invalid is skipped, so one mistake gives one error. Defaults
are those of ``dsl/spec.py`` (kv_heads = heads, pad_vocab_to = 128, ...).

Before: the schema (``dsl/validate.py``). After: ``dsl/build_spec.py``.
"""

from __future__ import annotations

import keyword
import math

from .diagnostics import ParcError, Span
from .normalize import Normalized

_DEFAULTS = {
    ("model", "pad_vocab_to"): 128,
    ("parallel", "sp"): False,
    ("parallel", "schedule"): {"kind": "1f1b"},
    ("parallel", "overlap"): {"kind": "none"},
}


class _Values:
    def __init__(self, norm: Normalized, bad: set):
        self.norm, self.bad = norm, bad
        self.bad_prefixes = {p[:end] for p in bad for end in range(1, min(len(p), 2) + 1)}
        """Every (block,) and (block, key) at or above a bad path: one set lookup
        per question, however many errors there are."""

    def get(self, block: str, key: str):
        """The value, its default, or None (auto, missing, or invalid)."""
        path = (block, key)
        if path in self.bad_prefixes or (block,) in self.bad or () in self.bad:
            return None
        values = self.norm.doc.get(block)
        if not isinstance(values, dict):
            return None
        value = values.get(key, _DEFAULTS.get(path))
        return None if value == "auto" else value

    def span(self, *paths: tuple) -> Span:
        """Where the first written of ``paths`` is (else its block, else the file)."""
        for path in paths:
            origin = self.norm.origins.get(path)
            if origin is not None:
                return origin.span
        for path in paths:
            origin = self.norm.origins.get(path[:1])
            if origin is not None:
                return origin.span
        return self.norm.start

    def written(self, block: str, key: str) -> bool:
        return (block, key) in self.norm.origins


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _some(values: list[int], near: int, limit: int = 10) -> str:
    """At most ``limit`` of ``values``, those closest to ``near``, in order."""
    chosen = sorted(sorted(values, key=lambda v: (abs(v - near), v))[:limit])
    text = ", ".join(str(v) for v in chosen)
    return text if len(values) <= limit else text + ", ..."


def run(norm: Normalized, bad: set) -> list[tuple[tuple, ParcError]]:
    values = _Values(norm, bad)
    found: list[tuple[tuple, ParcError]] = []

    def error(path: tuple, span: Span, code: str, message: str, hint: str | None = None) -> None:
        found.append((path, ParcError(span=span, code=code, message=message, hint=hint)))

    for check in CHECKS:
        check(values, error)
    return found


def _world(v: _Values, error) -> None:
    dp, tp, pp = v.get("parallel", "dp"), v.get("parallel", "tp"), v.get("parallel", "pp")
    nodes, per_node = v.get("mesh", "nodes"), v.get("mesh", "devices_per_node")
    if None in (dp, tp, pp, nodes, per_node) or dp * tp * pp == nodes * per_node:
        return
    world = nodes * per_node
    keys = [("parallel", k) for k in ("dp", "tp", "pp")]
    # Blame the degree given on the command line, if one was; else dp.
    overridden = [
        p for p in keys if p in v.norm.origins and v.norm.origins[p].span.file.startswith("--set")
    ]
    blame = (
        sorted(overridden, key=lambda p: int(v.norm.origins[p].span.file.split()[-1]))[-1:] or keys
    )
    if world % (tp * pp) == 0:
        hint = f"dp = {world // (tp * pp)} fits this mesh with tp = {tp} and pp = {pp}"
    else:
        hint = f"tp·pp = {tp * pp} must divide the {world} devices"
    error(
        ("parallel", "dp"),
        v.span(*blame),
        "PAR0201",
        f"world size: dp·tp·pp = {dp}·{tp}·{pp} = {dp * tp * pp}, but "
        f"nodes·devices_per_node = {nodes}·{per_node} = {world}",
        hint,
    )


def _heads(v: _Values, error) -> None:
    hidden, heads, kv_heads = (
        v.get("model", "hidden"),
        v.get("model", "heads"),
        v.get("model", "kv_heads"),
    )
    if hidden is not None and heads is not None and hidden % heads:
        error(
            ("model", "heads"),
            v.span(("model", "heads")),
            "PAR0202",
            f"hidden = {hidden} is not divisible by heads = {heads} "
            f"(head_dim = hidden / heads = {hidden / heads:g})",
            f"heads must divide hidden: one of {_some(_divisors(hidden), heads)}",
        )
    if heads is not None and kv_heads is not None and heads % kv_heads:
        error(
            ("model", "kv_heads"),
            v.span(("model", "kv_heads")),
            "PAR0204",
            f"heads = {heads} is not divisible by kv_heads = {kv_heads}",
            f"kv_heads must divide heads: one of {_some(_divisors(heads), kv_heads)}",
        )


def _tensor_parallel(v: _Values, error) -> None:
    tp = v.get("parallel", "tp")
    heads, ffn, vocab = v.get("model", "heads"), v.get("model", "ffn"), v.get("model", "vocab")
    kv_heads = v.get("model", "kv_heads") if v.written("model", "kv_heads") else None
    pad = v.get("model", "pad_vocab_to")
    if tp is None:
        return
    padded = -(-vocab // pad) * pad if vocab is not None and pad is not None else None
    sizes = [("heads", heads), ("kv_heads", kv_heads), ("ffn", ffn), ("padded vocab", padded)]
    known = [(n, s) for n, s in sizes if s is not None]
    failing = [(n, s) for n, s in known if s % tp]
    if not failing:
        return
    words = [f"{n} = {s}" if n != "padded vocab" else f"the padded vocab = {s}" for n, s in failing]
    listed = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    message = f"tp = {tp} does not divide {listed}"
    if any(n == "padded vocab" for n, _ in failing):
        message += f" (vocab = {vocab} rounded up to a multiple of pad_vocab_to = {pad})"
    common = math.gcd(*(s for _, s in known))
    hint = f"tp must be one of {_some(_divisors(common), tp)}"
    if [n for n, _ in failing] == ["padded vocab"]:
        hint += f", or pad the vocab further: pad_vocab_to = {math.lcm(pad, tp)}"
    error(("parallel", "tp"), v.span(("parallel", "tp")), "PAR0203", message, hint)


def _pipeline(v: _Values, error) -> None:
    layers, pp = v.get("model", "layers"), v.get("parallel", "pp")
    schedule, stage_layers = v.get("parallel", "schedule"), v.get("parallel", "stage_layers")
    chunks = schedule.get("chunks", 1) if isinstance(schedule, dict) else None
    schedule_span = v.span(("parallel", "schedule"))
    if chunks is not None and chunks > 1 and pp is not None and pp < 2:
        error(
            ("parallel", "schedule"),
            schedule_span,
            "PAR0212",
            f"schedule = interleaved(chunks = {chunks}) needs pp ≥ 2, but pp = {pp}",
            "use interleaving with a pipeline, or schedule = 1f1b",
        )
        return
    if stage_layers is not None:
        span = v.span(("parallel", "stage_layers"))
        if chunks is not None and chunks > 1:
            error(
                ("parallel", "stage_layers"),
                span,
                "PAR0206",
                f"stage_layers cannot be combined with interleaved(chunks = {chunks})",
                "remove stage_layers: interleaved stages split the layers evenly",
            )
        if pp is not None and len(stage_layers) != pp:
            error(
                ("parallel", "stage_layers"),
                span,
                "PAR0206",
                f"stage_layers has {len(stage_layers)} entries, but pp = {pp}",
                "give one entry per stage",
            )
        if layers is not None and sum(stage_layers) != layers:
            total = " + ".join(str(n) for n in stage_layers)
            error(
                ("parallel", "stage_layers"),
                span,
                "PAR0206",
                f"stage_layers sum to {total} = {sum(stage_layers)}, but layers = {layers}",
                "the stages together hold every layer once",
            )
        return
    if None in (layers, pp, chunks):
        return
    stages = pp * chunks
    if layers % stages:
        formula = f"pp·chunks = {pp}·{chunks} = {stages}" if chunks > 1 else f"pp = {pp}"
        if chunks == 1:
            hint = f"pp must divide layers = {layers}: one of {_some(_divisors(layers), pp)}; or give stage_layers"
        else:
            fits = [d // chunks for d in _divisors(layers) if d % chunks == 0 and d // chunks >= 2]
            hint = (
                f"with chunks = {chunks}, pp must be one of {_some(fits, pp)}"
                if fits
                else f"chunks = {chunks} does not divide layers = {layers}"
            )
        error(
            ("parallel", "pp"),
            v.span(("parallel", "pp")),
            "PAR0205",
            f"layers = {layers} cannot be split evenly into {formula} stages "
            f"({layers} / {stages} = {layers / stages:g})",
            hint,
        )


def _batch(v: _Values, error) -> None:
    global_batch, micro_batch = v.get("train", "global_batch"), v.get("train", "micro_batch")
    dp, pp = v.get("parallel", "dp"), v.get("parallel", "pp")
    if global_batch is None or micro_batch is None:
        return
    span = v.span(("train", "global_batch"))
    if dp is None:
        if global_batch % micro_batch:
            error(
                ("train", "global_batch"),
                span,
                "PAR0208",
                f"global_batch = {global_batch} is not divisible by micro_batch = {micro_batch}",
                "global_batch = micro_batch · grad_accum · dp",
            )
        return
    per_step = micro_batch * dp
    if global_batch % per_step:
        below = global_batch // per_step * per_step
        near = " or ".join(str(n) for n in (below, below + per_step) if n > 0)
        error(
            ("train", "global_batch"),
            span,
            "PAR0208",
            f"global_batch = {global_batch} is not divisible by micro_batch·dp = "
            f"{micro_batch}·{dp} = {per_step}",
            f"global_batch = micro_batch · grad_accum · dp: try global_batch = {near}",
        )
        return
    grad_accum = global_batch // per_step
    if pp is None or pp < 2:
        return
    formula = (
        f"global_batch / (micro_batch·dp) = {global_batch} / ({micro_batch}·{dp}) = {grad_accum}"
    )
    if grad_accum < pp:
        error(
            ("parallel", "pp"),
            v.span(("parallel", "pp"), ("train", "global_batch")),
            "PAR0207",
            f"micro-batches per step = {formula} is fewer than pp = {pp} stages",
            f"a pipeline needs at least {pp} micro-batches: raise global_batch to "
            f"{pp * per_step} or lower micro_batch",
        )
        return
    schedule = v.get("parallel", "schedule")
    if isinstance(schedule, dict) and schedule.get("kind") == "interleaved" and grad_accum % pp:
        error(
            ("parallel", "schedule"),
            v.span(("parallel", "schedule")),
            "PAR0212",
            f"interleaved needs micro-batches per step divisible by pp: {formula} is not a multiple of pp = {pp}",
            f"make global_batch a multiple of micro_batch·dp·pp = {per_step * pp}",
        )


def _sequence_parallel(v: _Values, error) -> None:
    sp, tp, seq_len = v.get("parallel", "sp"), v.get("parallel", "tp"), v.get("model", "seq_len")
    if sp is not True or tp is None:
        return
    if tp < 2:
        error(
            ("parallel", "sp"),
            v.span(("parallel", "sp")),
            "PAR0209",
            f"sp = true needs tp > 1, but tp = {tp}",
            "sequence parallelism splits along the tp axis: set tp ≥ 2, or sp = false",
        )
    elif seq_len is not None and seq_len % tp:
        error(
            ("model", "seq_len"),
            v.span(("model", "seq_len")),
            "PAR0210",
            f"seq_len = {seq_len} is not divisible by tp = {tp} (sp = true splits the sequence over tp)",
            f"make seq_len a multiple of {tp}, or set sp = false",
        )


def _per_layer(v: _Values, error) -> None:
    """A per-layer list has one entry per block (Note [per-layer values])."""
    layers = v.get("model", "layers")
    for key in ("recompute", "overlap"):
        value = v.get("parallel", key)
        if not isinstance(value, list) or layers is None or len(value) == layers:
            continue
        error(
            ("parallel", key),
            v.span(("parallel", key)),
            "PAR0216",
            f"`parallel.{key}` lists {len(value)} value{'s' if len(value) != 1 else ''} "
            f"but the model has layers = {layers}",
            f"give one value per layer ({layers}), or a single value for all of them",
        )


def _overlap(v: _Values, error) -> None:
    overlap, micro_batch = v.get("parallel", "overlap"), v.get("train", "micro_batch")
    if micro_batch is None and v.get("parallel", "tp") != 1:
        return
    for index, one in enumerate(overlap if isinstance(overlap, list) else [overlap]):
        _overlap_one(v, error, one, micro_batch, () if not isinstance(overlap, list) else (index,))


def _overlap_one(v: _Values, error, overlap, micro_batch, at: tuple) -> None:
    if not isinstance(overlap, dict) or overlap.get("kind") != "sub_batch":
        return
    path = ("parallel", "overlap", *at)
    if v.get("parallel", "tp") == 1:  # tp = auto may still choose tp ≥ 2
        parts = overlap.get("sub_batches")
        error(
            ("parallel", "overlap"),
            v.span(path),
            "PAR0215",
            f"overlap = sub_batch({parts}) has nothing to overlap: tp = 1",
            "overlap splits tensor-parallel communication; with tp = 1 there is none "
            "— remove it or raise tp",
        )
        return
    if micro_batch is None:
        return
    parts = overlap.get("sub_batches")
    if parts is None or micro_batch % parts == 0:
        return
    choices = [d for d in _divisors(micro_batch) if d >= 2]
    hint = (
        f"sub_batches must divide micro_batch: one of {_some(choices, parts)}"
        if choices
        else (
            f"micro_batch = {micro_batch} cannot be split; use overlap = none or a larger micro_batch"
        )
    )
    path = ("parallel", "overlap", *at)
    error(
        ("parallel", "overlap"),
        v.span(path + ("sub_batches",), path),
        "PAR0211",
        f"sub_batch({parts}) does not divide micro_batch = {micro_batch}",
        hint,
    )


def _model_name(v: _Values, error) -> None:
    name = v.get("model", "name")
    if isinstance(name, str) and keyword.iskeyword(name):
        error(
            ("model", "name"),
            v.span(("model", "name")),
            "PAR0114",
            f"`{name}` is a Python keyword and cannot name the model",
            f"try `{name}_model`",
        )


def _train(v: _Values, error) -> None:
    schedule, steps = v.get("train", "schedule"), v.get("train", "steps")
    if isinstance(schedule, dict) and steps is not None and schedule.get("warmup", 0) > steps:
        warmup = schedule["warmup"]
        error(
            ("train", "schedule"),
            v.span(("train", "schedule", "warmup"), ("train", "schedule")),
            "PAR0213",
            f"warmup = {warmup} is more than steps = {steps}",
            f"warmup is counted in steps: at most {steps}",
        )
    data, vocab = v.get("train", "data"), v.get("model", "vocab")
    if isinstance(data, dict) and data.get("kind") == "tokens" and vocab is not None:
        dtype = data.get("dtype", "uint16")
        if dtype == "uint16" and vocab > 2**16:
            error(
                ("train", "data"),
                v.span(("train", "data", "dtype"), ("train", "data")),
                "PAR0214",
                f"vocab = {vocab} does not fit the token file's dtype uint16 (at most 65536 ids)",
                'write tokens("...", dtype = uint32)',
            )


CHECKS = (
    _model_name,
    _world,
    _heads,
    _tensor_parallel,
    _pipeline,
    _batch,
    _sequence_parallel,
    _per_layer,
    _overlap,
    _train,
)
