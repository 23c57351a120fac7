"""The per-layer settings: each one an entry, which every stage reads by name.

Takes: nothing. Gives: ``SETTINGS``, one ``LayerSetting`` per setting a spec may give
per transformer block (``recompute``, ``overlap``), and ``setting(name)``. The name of
an entry is its spec key's last word and the name it has everywhere: in
``constraints.KEYS``, as a ``ParallelSpec`` field, a ``LayerLayout`` field of the
Plan and a field of the planner's ``Layout``. Torch-free: ``parc.dsl`` imports it.

Note [a per-layer setting is an entry]: the front end (``dsl/build_spec.py``,
``dsl/checks.py``: ``read``), the rules (``constraints.PER_LAYER``), the lowering
(``lay_out_layers``), the renderer (``codegen/render.py``: ``constant``,
``comment``, ``module``; the transform line ``parallelize.<name>``), ``str(plan)``, the search (``options``,
``simpler``, ``tie``), ``parc plan``'s words and reasons (``word``, ``reasons``) all
loop over ``SETTINGS``, so none of them names a setting. What is left to the setting
itself: its key in ``dsl/keys/`` (``per_layer=True``), its rules in
``constraints/``, the fields named after it, the runtime piece that does the work
(its step of ``runtime/models/parallelize.py``, named as the setting and placed in
``transforms.ORDER``, its work in ``parallelize_steps.py``) and its term in the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSetting:
    name: str
    """The spec key's last word, and the setting's name everywhere."""
    key: str
    """The dotted spec key."""
    off: object
    """The value that changes nothing (the embedding and the head carry it)."""
    order: tuple
    """Every value the search proposes, simplest first (None: ``options`` decides)."""
    read: Callable[[object], object]
    """One entry of the checked document (a word or a call's dict) → its plain value."""
    write: Callable[[object], object]
    """The inverse of ``read``: a plain value → its entry in a JSON spec."""
    word: Callable[[object], str]
    """A plain value → the spec's words for it."""
    constant: str
    """The ``train.py`` constant holding it (one value, or one per block)."""
    comment: Callable[[tuple, Mapping], tuple[str, ...]]
    """(each block's value, the layout's facts: ``sp``, ``block_tp``) → the constant's comment lines."""
    module: str | None = None
    """The runtime module a build ships only when some block uses the setting."""
    options: Callable[[Mapping], list] | None = None
    """(the candidate's bound values: ``tp``, ``micro_batch``) → the values the search tries."""
    tie: str = ""
    """What a tie between layouts prefers (the lower ``simpler``)."""
    reasons: Mapping[str, str] = field(default_factory=dict)
    """Why a change of this setting changes a part of the step time (``compute``, ``exposed_comm``)."""
    short: str = ""
    """Its name in ``parc plan``'s table (``rc:full``)."""
    self_naming: bool = False
    """One value's word names the setting by itself (``sub_batch(2)``): shown without a label."""

    def simpler(self, value) -> float:
        """How far from the simplest program a value (or one per block: their mean) is."""
        values = value if isinstance(value, tuple) else (value,)
        rank = self.order.index if self.order else float
        return sum(rank(v) for v in values) / len(values)

    def used(self, values: tuple) -> bool:
        """Some block's value is not ``off``."""
        return any(value != self.off for value in values)


# ---- recompute --------------------------------------------------------------------

RECOMPUTE_WORDS = {
    "selective": "attention core redone in backward",
    "full": "each block redone from its input",
    "none": "nothing redone",
}


def _recompute_comment(values: tuple, facts: Mapping) -> tuple[str, ...]:
    if len(set(values)) == 1:
        return (RECOMPUTE_WORDS[values[0]],)
    modes = " / ".join(f"{m}: {RECOMPUTE_WORDS[m]}" for m in dict.fromkeys(values))
    return (f"each block's recompute, layers.0 first ({modes})",)


RECOMPUTE = LayerSetting(
    name="recompute", key="parallel.recompute", off="none", order=("none", "selective", "full"),
    read=lambda entry: entry, write=lambda mode: mode, word=str, constant="RECOMPUTE",
    comment=_recompute_comment, tie="less recompute", short="rc",
    reasons={
        "compute": "less recompute: fewer forward passes re-run in backward",
        "exposed_comm": "full recompute repeats the forward's collectives",
    },
)


# ---- overlap (Oases sub-batches) ----------------------------------------------------


def _parts(entry) -> int | None:
    """``sub_batch(k)`` → k; ``none`` → 1 (None: not a checked call)."""
    return entry.get("sub_batches", 1) if isinstance(entry, dict) else None


def _overlap_call(parts: int) -> dict:
    return {"kind": "sub_batch", "sub_batches": parts} if parts > 1 else {"kind": "none"}


def _overlap_word(parts: int) -> str:
    return f"sub_batch({parts})" if parts > 1 else "none"


def _overlap_comment(values: tuple, facts: Mapping) -> tuple[str, ...]:
    what = "reduce-scatter and all-gather along T" if facts.get("sp") else "all-reduce"
    if len(set(values)) == 1:
        runs = f"each micro-batch runs as {values[0]} sub-batches (Oases)"
    else:
        runs = "each block's sub-batches, layers.0 first (1: not split; Oases)"
    lines = (f"{runs}: sub-batch i's", f"tensor-parallel {what} runs while sub-batch i+1 computes (runtime/parallel/tensor/overlap.py)")
    plain = [i for i, t in enumerate(facts.get("block_tp", ())) if t == 1 and values[min(i, len(values) - 1)] > 1]
    if plain:  # per-layer tp (constraints PAR0256): nothing to hide at tp 1
        lines += (f"the blocks at tp 1 ({', '.join(f'layers.{i}' for i in plain)}) have no tp collective and run "
                  "unsplit",)
    return lines


def _overlap_options(values: Mapping) -> list[int]:
    """Every split of the micro-batch, when there is tensor-parallel communication to hide."""
    micro_batch, tp = values["micro_batch"], values["tp"]
    return [1] + ([k for k in range(2, micro_batch + 1) if micro_batch % k == 0] if tp > 1 else [])


OVERLAP = LayerSetting(
    name="overlap", key="parallel.overlap", off=1, order=(), read=_parts, write=_overlap_call, word=_overlap_word,
    constant="OVERLAP_SUB_BATCHES", comment=_overlap_comment, module="overlap",
    options=_overlap_options, tie="fewer sub-batches", short="overlap", self_naming=True,
    reasons={
        "compute": "fewer, larger sub-batches: bigger GEMMs and fewer op dispatches",
        "exposed_comm": "sub-batches hide tensor-parallel collectives behind compute",
    },
)


SETTINGS = (RECOMPUTE, OVERLAP)
"""Every per-layer setting, in the order ``train.py`` lists them."""

_BY_NAME = {entry.name: entry for entry in SETTINGS}


def setting(name: str) -> LayerSetting:
    return _BY_NAME[name]


def read_value(name: str, value):
    """A checked document's value (one entry or a list of one per block) → plain value(s)."""
    read = setting(name).read
    return tuple(read(entry) for entry in value) if isinstance(value, list) else read(value)


def fold_runs(values) -> list[tuple[object, int]]:
    """Runs of equal neighbours: ``[a, a, b]`` → ``[(a, 2), (b, 1)]``."""
    runs: list[tuple[object, int]] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1] + 1)
        else:
            runs.append((value, 1))
    return runs


def folded(values, word=str) -> str:
    """One value per block with its runs folded: ``[2 ×3, 1]``."""
    return "[" + ", ".join(f"{word(v)} ×{n}" if n > 1 else word(v) for v, n in fold_runs(values)) + "]"


def words(entry: LayerSetting, value) -> str | None:
    """``full``, ``sub_batch(2)``, or per block ``[full ×3, none ×93]``; None when off."""
    values = value if isinstance(value, tuple) else (value,)
    if not entry.used(values):
        return None
    if not isinstance(value, tuple):
        return entry.word(value)
    return folded(values, entry.word)


def spec_text(entry: LayerSetting, value) -> str:
    """A value as the spec writes it (``--set`` too): ``full``, ``[sub_batch(2), none]``."""
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(entry.word(one) for one in value) + "]"
    return entry.word(value)


def shown(entry: LayerSetting, value, label: str) -> str | None:
    """``words`` after ``label`` (``rc:``, ``recompute ``) unless one value names itself."""
    text = words(entry, value)
    if text is None or (entry.self_naming and not isinstance(value, tuple)):
        return text
    return label + text
