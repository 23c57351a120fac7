"""Every layout a spec's values allow: the search space, for the planner and the checker.

Takes: plain values by the names of ``constraints.KEYS`` (None: ``auto``; the mesh,
the model's shape and the global batch known). Gives: ``layouts(values)``, each legal
completion of the ``auto`` values as a dict of the same names, and ``no_layout(values)``,
the violation of a spec whose fixed values leave none. The layout search
(``codegen/planner/search.py``) scores what ``layouts`` yields; ``parc check``
(``dsl/checks.py``) asks ``no_layout``, so a spec the planner can find no layout for is
refused at check time with the build's own code and words (PAR0801).

Note [the search space]: the loops propose values (tp and pp among the divisors of the
world, micro_batch among those of global_batch, the schedules, every ZeRO stage, sp,
and each per-layer setting's options, ``layer_settings.SETTINGS``) and the rules of
``constraints/`` decide, level by level: a rule runs as soon as the values it needs
are bound, so a bad tp is dropped before its pipelines are tried. The proposals are a
superset of what the rules allow. The ``BUILD`` rules do not filter (``parc plan``
predicts zero 3; the search marks it not buildable). Three families give the same
program as a listed one and are left out: ZeRO stages above 0 with dp = 1, overlap
with tp = 1, and gpipe with one stage. The leaf values (``LEAF_NAMES``) are chosen
independently: no rule reads two of them (tests/planner), so every combination of the
options each one passes alone is legal. The context-parallel degree ``cp`` is searched
among the divisors of the world when the spec writes ``cp = auto`` (its kind is the
spec's, ``ring`` by default); otherwise it is the spec's (1 unless given). dp fills what
tp·pp·cp leave. The expert-parallel degree ``ep`` (``ep = auto``) is searched among the
divisors of the experts, once dp and tp are known (the rules keep those dividing dp·tp),
with the expert layers' other degrees (``rules_experts.expert_folds``); each leaf's tp grid
last (``rules_mesh.tp_grid_choices``).
"""

from __future__ import annotations

import itertools
from typing import Iterator, Mapping

from .constraints import KEYS, Violation, divisors, legal
from .constraints.rules_experts import EXPERT_DEGREES, expert_folds
from .constraints.rules_mesh import tp_grid_choices
from .layer_settings import SETTINGS
from ..schedules.schedule import KINDS, SLICED

LEAF_NAMES = ("zero", "sp", "compress", *(entry.name for entry in SETTINGS))
"""The values chosen last, each on its own (Note [the search space])."""


def _allowed(fixed, options: list) -> list:
    """``[fixed]`` for a value the spec gives, else every option."""
    return [fixed] if fixed is not None else options


SLICES = (2, 4, 8)
"""The token slices per sequence ``schedule = auto`` tries under a sliced kind
(``schedule.SLICED``; the rules keep those dividing seq_len)."""


def schedules(layers: int, pp: int) -> list[tuple[str, int, int]]:
    """The pipeline schedules to try, before the rules, as (kind, chunks, slices) in the
    spec's values (``chunks``: interleaved's, else 1; ``schedule.chunks_for`` gives the
    chunks a rank runs): every kind of the schedule table (``schedule.KINDS``), 1f1b first
    (the default, kept on a tie) (``gpipe`` with one stage is ``1f1b``)."""
    if pp == 1:
        return [("1f1b", 1, 1)]
    kinds = ("1f1b", *(kind for kind in KINDS if kind != "1f1b"))
    return [(kind, chunks, slices) for kind in kinds for chunks, slices in _variants(kind, layers)]


def _variants(kind: str, layers: int) -> list[tuple[int, int]]:
    """(chunks, slices) to try for ``kind``: interleaved's chunks, a sliced kind's slices, else one."""
    if kind == "interleaved":
        return [(v, 1) for v in divisors(layers) if v > 1]
    return [(1, s) for s in SLICES] if kind in SLICED else [(1, 1)]


def layouts(values: Mapping[str, object]) -> Iterator[dict]:
    """Each legal layout agreeing with the fixed values, as ``values`` completed."""
    world = values["nodes"] * values["devices_per_node"]
    fixed_schedule = (None if values.get("schedule") is None
                      else [(values["schedule"], values["chunks"], values.get("slices") or 1)])
    for cp in _allowed(values.get("cp"), divisors(world)):
        with_cp = {**values, "cp": cp}
        if legal(with_cp, touching=("cp",)):
            yield from _with_cp(with_cp, world, fixed_schedule)


def _with_cp(values: dict, world: int, fixed_schedule) -> Iterator[dict]:
    cp = values["cp"]
    for tp in _allowed(values.get("tp"), divisors(world)):
        with_tp = {**values, "tp": tp}
        if not legal(with_tp, touching=("tp",)):
            continue
        for pp in _allowed(values.get("pp"), divisors(world // (tp * cp)) if world % (tp * cp) == 0 else []):
            dp = world // (tp * pp * cp) if world % (tp * pp * cp) == 0 else 0
            degrees = {**with_tp, "pp": pp, "dp": values["dp"] if values.get("dp") is not None else dp}
            if not dp or not legal(degrees, touching=("pp", "dp")):
                continue
            for fold in expert_folds(degrees):
                folded = {**degrees, **fold}
                if legal(folded, touching=tuple(fold)):
                    yield from _batches(folded, fixed_schedule)


def _batches(degrees: dict, fixed_schedule) -> Iterator[dict]:
    for micro_batch in _allowed(degrees.get("micro_batch"), divisors(degrees["global_batch"])):
        batch = {**degrees, "micro_batch": micro_batch}
        if not legal(batch, touching=("micro_batch",)):
            continue
        for schedule, chunks, slices in fixed_schedule or schedules(degrees["layers"], degrees["pp"]):
            timed = {**batch, "schedule": schedule, "chunks": chunks, "slices": slices}
            if legal(timed, touching=("schedule", "chunks", "slices")):
                yield from _leaves(timed)


def _leaves(values: dict) -> Iterator[dict]:
    """The layouts of one (degrees, micro_batch, schedule): ZeRO, sp, the per-layer settings."""
    proposals = {
        "zero": _allowed(values.get("zero"), [0, 1, 2, 3] if values["dp"] > 1 else [0]),
        "sp": _allowed(values.get("sp"), [False, True]),
        # compress = auto: PowerSGD and top-k are offered where there is a dp reduction to compress
        "compress": _allowed(values.get("compress"),
                             ["none", "powersgd", "topk"] if values["dp"] * values["cp"] > 1 else ["none"]),
        **{
            entry.name: _allowed(values.get(entry.name), list(entry.order) if entry.order else entry.options(values))
            for entry in SETTINGS
        },
    }
    options = {
        name: [option for option in offered if legal({**values, name: option}, touching=(name,))]
        for name, offered in proposals.items()
    }
    for combination in itertools.product(*options.values()):
        leaf = {**values, **dict(zip(options, combination))}
        for grid in tp_grid_choices(leaf):  # Note [2D tensor parallelism] in layers2d.py
            yield {**leaf, **grid}


SEARCHED = ("dp", "cp", "tp", "pp", *EXPERT_DEGREES, "micro_batch", "schedule", *LEAF_NAMES)
"""The values ``layouts`` fills in when they are ``auto``."""

def no_layout(values: Mapping[str, object]) -> Violation | None:
    """PAR0801 when some value is ``auto`` and no completion of them is legal."""
    auto = [name for name in SEARCHED if values.get(name) is None]
    if any(values.get(name) is None for name in ("nodes", "devices_per_node", "layers", "global_batch")):
        return None  # not a question of the layout (reported elsewhere)
    if not auto or next(layouts(values), None) is not None:
        return None
    world = values["nodes"] * values["devices_per_node"]
    fixed = [name for name in ("dp", "tp", "pp", "micro_batch") if values.get(name) is not None]
    given = f" with {', '.join(f'{name} = {values[name]}' for name in fixed)}" if fixed else ""
    return Violation(
        code="PAR0801", blame=(*(KEYS[name] for name in fixed), "parallel"), blame_latest_set=True, rule="no_layout",
        message=f"the planner found no valid layout for this mesh and batch: no choice of "
                f"{', '.join(auto)} passes the rules on {world} devices{given}",
        hint=f"each degree must divide the {world} devices, and global_batch = {values['global_batch']} must "
             f"split as micro_batch · grad_accum · dp; fix fewer values or change these",
    )
