"""The pairs of features parc build cannot generate together yet: one table.

Takes: ``KEYS`` values. Gives: ``SWITCHES`` (each feature the table talks about: the
values that turn it on, and how the spec writes it), ``UNBUILT`` (one row per refused
pair: the two switches, the code, why, what to write instead), the ``BUILD`` rules made
from the rows, ``matrix()`` (every switch against every other: the code refusing the
pair, or None) and ``markdown()`` (docs/language.md's table, kept equal by a test).

Note [an unbuilt pair is a row]: making a pair buildable is deleting its row (and
building it); refusing one is adding a row. Each row becomes a rule named
``unbuilt_<a>_<b>`` reading both switches' values: it runs once those are known (a
switch's ``needs``; ``auto`` is unknown, so the planner may still choose a value that
builds) and reports ``<a as written> with <b as written> is not supported yet by parc
build: <why>``, blaming a's key then b's, with ``instead`` as the hint. Shapes that are
not a pair stay rules of their own: per-layer tp/dp's refusals (``rules_hetero.py``:
they read ``auto`` values too), 2D tp's kv-head rule, ``UNBUILDABLE`` values.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from ..layer_settings import SETTINGS, spec_text
from ..rule_engine import BUILD, Violation, entries, rule
from ..rule_keys import KEYS
from .rules_mesh import tp_2d


@dataclass(frozen=True, slots=True, kw_only=True)
class Switch:
    name: str
    needs: tuple[str, ...]
    """``KEYS`` names that must be known (the first is the one blamed)."""
    on: Callable[..., bool]
    """(**values of ``needs`` and ``optional``) → whether the spec asks for the feature."""
    text: Callable[..., str]
    """(**the same values) → the feature as the spec writes it."""
    off: str
    """What to write instead to do without it (a row's hint may name it)."""
    optional: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return KEYS[self.needs[0]]


def _drops(capacity_factor) -> bool:
    """Whether a capacity drops tokens (``none``, dropless, is the word at check time)."""
    return capacity_factor not in (None, "none")


def _setting(name: str) -> Callable:
    entry = next(e for e in SETTINGS if e.name == name)
    return lambda value: spec_text(entry, value)


def _list(value) -> str:
    return "[" + ", ".join(str(v) for v in value) + "]"


def _schedule(kind: str) -> Switch:
    return Switch(name=kind, off="schedule = 1f1b", needs=("schedule",), optional=("pp",), on=lambda schedule, pp=None: schedule == kind
                  and pp != 1, text=lambda schedule, pp=None: f"schedule = {kind}")


SWITCHES = {s.name: s for s in (
    Switch(name="zero", off="zero = 0", needs=("zero",), on=lambda zero: zero in (1, 2), text=lambda zero: f"zero = {zero}"),
    Switch(name="zero3", off="zero = 2", needs=("zero",), on=lambda zero: zero == 3, text=lambda zero: "zero = 3"),
    Switch(name="hsdp", off="zero_shard = dp", needs=("zero_shard", "zero"), on=lambda zero_shard, zero: zero == 3 and zero_shard == "node",
           text=lambda zero_shard, zero: "zero_shard = node"),
    Switch(name="grad_reduce_bf16", off="grad_reduce = fp32", needs=("grad_reduce",), on=lambda grad_reduce: grad_reduce == "bf16",
           text=lambda grad_reduce: "grad_reduce = bf16"),
    Switch(name="experts", off="a dense model (experts = 0)", needs=("experts",), on=lambda experts: experts > 0,
           text=lambda experts: "a mixture of experts"),
    Switch(name="experts_without_ep", off="ep > 1", needs=("experts",), optional=("ep",),
           on=lambda experts, ep=None: experts > 0 and (ep or 1) == 1,
           text=lambda experts, ep=None: "a mixture of experts without expert parallelism"),
    Switch(name="ep", off="ep = 1", needs=("ep",), optional=("etp",), on=lambda ep, etp=None: ep * (etp or 1) > 1,
           text=lambda ep, etp=None: f"expert parallelism (ep = {ep}, etp = {etp or 1})"),
    Switch(name="capacity", off="capacity_factor = none (dropless)", needs=("capacity_factor",), on=_drops,
           text=lambda capacity_factor: f"capacity_factor = {capacity_factor}"),
    Switch(name="sp", off="sp = false", needs=("sp",), on=lambda sp: sp is True, text=lambda sp: "sp = true"),
    Switch(name="cp", off="cp = 1", needs=("cp",), on=lambda cp: cp > 1, text=lambda cp: f"cp = {cp}"),
    Switch(name="recompute", off="recompute = none", needs=("recompute",), on=lambda recompute: any(
        e not in (None, "none") for e in entries(recompute)), text=lambda recompute: f"recompute = "
           f"{_setting('recompute')(recompute)}"),
    Switch(name="overlap", off="overlap = none", needs=("overlap",), on=lambda overlap: any(
        k is not None and k > 1 for k in entries(overlap)), text=lambda overlap: f"overlap = "
           f"{_setting('overlap')(overlap)}"),
    Switch(name="compress", off="compress = none", needs=("compress",), on=lambda compress: compress not in ("none", None),
           text=lambda compress: f"compress = {compress}"),
    Switch(name="compress_pp", off="compress_pp = none", needs=("compress_pp",), on=lambda compress_pp: compress_pp not in ("none", None),
           text=lambda compress_pp: f"compress_pp = {compress_pp}"),
    Switch(name="interleaved", off="schedule = 1f1b", needs=("chunks",), on=lambda chunks: chunks > 1,
           text=lambda chunks: f"an interleaved schedule (chunks = {chunks})"),
    _schedule("zero_bubble"),
    _schedule("zero_bubble_v"),
    _schedule("chimera"),
    _schedule("terapipe"),
    Switch(name="tp_2d", off="tp_shape = (1, tp) (1D)", needs=("tp_shape",), on=tp_2d,
           text=lambda tp_shape: f"tp_shape = ({tp_shape[0]}, {tp_shape[1]}) (2D tensor parallelism)"),
    Switch(name="layer_tp", off="one tp for every layer", needs=("layer_tp",), on=lambda layer_tp: layer_tp is not None,
           text=lambda layer_tp: f"tp = {_list(layer_tp)}"),
    Switch(name="documents", off="documents = joined", needs=("documents",), on=lambda documents: documents == "separate",
           text=lambda documents: "documents = separate"),
    Switch(name="layer_dp", off="one dp for every layer", needs=("layer_dp",), on=lambda layer_dp: layer_dp is not None,
           text=lambda layer_dp: f"dp = {_list(layer_dp)}"),
)}
"""Each feature the table names, by the name the matrix shows."""


@dataclass(frozen=True, slots=True)
class Unbuilt:
    a: str
    b: str
    code: str
    why: str
    instead: str
    """The hint; ``{a}``, ``{b}`` stand for the two as written, ``{a_off}``, ``{b_off}`` for
    their switches' ``off``."""


_TERAPIPE = "a slice's keys and values are kept whole in each stage's attention"
_CAPACITY_SLICES = ("a capacity ranks the whole micro-batch's tokens to drop, later slices' included (terapipe.py, "
                    "Note [experts in a slice])")
_2D = "the 2D layers do not meet its sharding of the hidden state yet"

UNBUILT = (
    Unbuilt("compress", "zero3", "PAR0270", "ZeRO-3 reduce-scatters whole gradients into the shards as backward "
            "produces them", "use zero = 1 or 2 with {a}, or {a_off} with {b}"),
    Unbuilt("compress_pp", "interleaved", "PAR0273", "the codec keys its state by virtual stage",
            "use schedule = 1f1b (or gpipe, zero_bubble) with {a}, or {a_off}"),
    Unbuilt("compress", "chimera", "PAR0276", "chimera sums its replicas' gradients outside the compressed "
            "reduction", "use schedule = 1f1b (or gpipe) with {a}, or {a_off}"),
    Unbuilt("compress", "zero_bubble_v", "PAR0276", "ZB-V hands the V's turn over in memory, outside the "
            "compressed reduction", "use schedule = 1f1b (or gpipe) with {a}, or {a_off}"),
    Unbuilt("compress_pp", "chimera", "PAR0276", "the codec's per-boundary state does not meet chimera's two "
            "pipelines", "use schedule = 1f1b (or gpipe) with {a}, or {a_off}"),
    Unbuilt("compress_pp", "zero_bubble_v", "PAR0276", "the codec's per-boundary state does not meet the V's "
            "turn", "use schedule = 1f1b (or gpipe) with {a}, or {a_off}"),
    Unbuilt("compress_pp", "zero_bubble", "PAR0276", "the split backward does not run the pipeline codec",
            "use schedule = 1f1b (or gpipe) with {a}, or {a_off}"),
    Unbuilt("overlap", "experts_without_ep", "PAR0812", "a MoE model's sub-batches are its expert all-to-alls'",
            "write {a_off}, or {b_off} (the sub-batches then overlap the expert all-to-alls)"),
    *(Unbuilt(other, "terapipe", "PAR0264", _TERAPIPE, "use {b_off} with {a}, or {a_off} with {b}")
      for other in ("cp", "overlap", "compress_pp", "layer_tp", "layer_dp",
                    "tp_2d")),
    Unbuilt("capacity", "terapipe", "PAR0264", _CAPACITY_SLICES, "use {b_off} with {a}, or {a_off} with {b}"),
    *(Unbuilt(other, "tp_2d", "PAR0277", _2D, "use {a_off} with {b}, or {b_off}")
      for other in ("cp", "experts", "layer_tp", "overlap", "compress", "compress_pp")),
    *(Unbuilt("documents", other, "PAR0285", why, "use {b_off} with {a}, or {a_off} with {b}") for other, why in (
        ("overlap", "the document mask is per sequence and is not split with the sub-batches yet"),
        ("layer_tp", "the document mask does not follow the batch between per-layer layouts yet"),
        ("layer_dp", "the document mask does not follow the batch between per-layer layouts yet"),
        ("tp_2d", "the 2D layers' attention does not take the document mask yet"))),
)
"""One row per pair parc build refuses (Note [an unbuilt pair is a row])."""


def _values(switch: Switch, values: dict) -> dict:
    return {name: values.get(name) for name in switch.needs + switch.optional}


def _check(row: Unbuilt) -> Callable:
    a, b = SWITCHES[row.a], SWITCHES[row.b]

    def check(**values):
        first, second = _values(a, values), _values(b, values)
        if not (a.on(**first) and b.on(**second)):
            return None
        return Violation(code=row.code, blame=(a.key, b.key),
                         message=f"{a.text(**first)} with {b.text(**second)} is not supported yet by parc build: "
                                 f"{row.why}",
                         hint=row.instead.format(a=a.text(**first), b=b.text(**second), a_off=a.off,
                                                 b_off=b.off))

    needs = dict.fromkeys(a.needs + b.needs)
    optional = [n for n in dict.fromkeys(a.optional + b.optional) if n not in needs]
    check.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in needs]
        + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in optional])
    return check


for _row in UNBUILT:
    rule(_row.code, BUILD, name=f"unbuilt_{_row.a}_{_row.b}")(_check(_row))


def matrix() -> dict[tuple[str, str], str | None]:
    """(switch, switch) → the code refusing the pair (both orders), or None."""
    refused = {}
    for row in UNBUILT:
        refused[(row.a, row.b)] = refused[(row.b, row.a)] = row.code
    return {(a, b): refused.get((a, b)) for a in SWITCHES for b in SWITCHES}


def matrix_text() -> str:
    """``parc check --matrix``: every switch against every other, the refusing code or ``·``."""
    names = list(SWITCHES)
    width = max(map(len, names))
    cells = matrix()
    lines = [" " * (width + 4) + " ".join(f"{i:>4}" for i in range(1, len(names) + 1))]
    for i, a in enumerate(names, 1):
        row = " ".join(f"{(cells[(a, b)] or '·').removeprefix('PAR'):>4}" for b in names)
        lines.append(f"{a:>{width}} {i:>2} {row}")
    pairs = len(names) * (len(names) - 1) // 2
    lines.append(f"{len(UNBUILT)} of {pairs} pairs of these {len(names)} features are not built yet: a cell is the "
                 "code (PAR0…) refusing the pair, a column the row of that number; docs/language.md lists why")
    return "\n".join(lines)


def markdown() -> str:
    """docs/language.md's table of unbuilt pairs, one line per row."""
    lines = ["| feature | with | code | why | instead |", "|---|---|---|---|---|"]
    for row in UNBUILT:
        a, b = SWITCHES[row.a], SWITCHES[row.b]
        instead = row.instead.format(a=f"`{row.a}`", b=f"`{row.b}`", a_off=f"`{a.off}`", b_off=f"`{b.off}`")
        lines.append(f"| {row.a} | {row.b} | {row.code} | {row.why} | {instead} |")
    return "\n".join(lines)
