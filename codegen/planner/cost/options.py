"""The layout's options beyond its degrees and per-layer settings, one ``Option`` entry each,
written by the cost module that prices it.

Takes: nothing. Gives: ``Option`` and ``options()``, the entries in the order their words
print. Before: the owners (``cost/context.py``, ``cost/tp2d.py``, ``cost/experts.py``).
After: ``codegen/layout_words.py``, ``planner/why.py``, ``planner/search.py``,
``cli/plan.py``.

Note [an option is an entry]: like ``layer_settings.SETTINGS`` for the per-layer settings
and ``codegen/features.FEATURES`` for a build, an option of the planner's ``Layout`` (a
``Layout`` field that is neither a degree nor a per-layer setting) keeps its facts in one
``Option`` beside its cost: how it reads from a spec and a ``Plan``, how it is written back
to a spec, its words (after the degree it qualifies, ``cp 2 (ring)``, or of their own after
ep's), its cell in ``parc plan``'s settings column, whether ``why`` compares it and what
it says of it. The generic files loop over ``options()`` and never name one; the time and
memory models call their owners' hooks (``context.cp_comm``, ``tp2d.grid_block_comm``,
``compress.pipeline_messages``, ...). A new option adds its ``Layout`` field, its entry in
its cost module and that module to ``OWNERS`` below.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Callable

OWNERS = ("context", "tp2d", "experts")
"""The cost modules (``codegen/planner/cost/``) that export ``OPTIONS``, in print order.
Imported by name when first asked (``options``), as ``schedule.kind_module`` finds a
schedule's module: each owner imports this module for ``Option``, and ``cost/layout.py``
and ``layout_words.py``, which the owners import, read the entries too."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    name: str
    """The ``Layout`` field, the spec's ``parallel`` key and ``parc plan --json``'s field."""
    default: object
    """Its value when a ``Words`` does not give it."""
    words: Callable[[object], str | None]
    """A value's words, None when it is not shown."""
    axis: str = ""
    """The degree whose words it qualifies (``cp`` → ``cp 2 (ring)``, shown when that axis
    is split); "": its words are an option of their own, after ep."""
    of_plan: Callable
    """Its value in a build's ``Plan`` (``layout_words.of_plan``)."""
    of_spec: Callable
    """Its value in the planner's ``Layout`` of a spec's complete layout (``ParallelSpec`` → value)."""
    to_spec: Callable = lambda value, par: {}
    """The spec's ``parallel`` fields a chosen value writes over ``par`` (``search.with_layout``)."""
    auto: Callable | None = None
    """``ParallelSpec`` → whether the spec leaves it to the planner (``parc build`` fills it and
    cites its ``auto``: passes/choose_layout.py's ``PLANNED_KEYS``); None: never planned."""
    column: Callable = lambda layout: None
    """Its cell in ``parc plan``'s settings column for a ``Layout``, or None."""
    compared: bool = False
    """``why`` names it when two layouts differ in it (after ZeRO)."""
    shown: Callable = str
    """A value in ``why``'s comparisons."""
    reasons: dict = field(default_factory=dict)
    """``why``'s reason, by the term of the step time a difference in it moves."""
    why: Callable | None = None
    """``why``'s lines when the winner uses it (a value other than ``default``): ``(best,
    index, hw, without, seconds) → list[str]``, ``without`` the same layout's ``Estimate``
    with the option at its default, ``seconds`` why's signed time format."""


@functools.cache
def options() -> tuple[Option, ...]:
    """Every option, in ``OWNERS`` order (Note [an option is an entry])."""
    return tuple(entry for owner in OWNERS for entry in importlib.import_module(f"{__package__}.{owner}").OPTIONS)


def qualified(layout, axis: str) -> str:
    """`` (ring)``: the words the options of ``axis`` add after its degree, for a ``Layout``."""
    return "".join(f" ({text})" for entry in options() if entry.axis == axis
                   and (text := entry.words(getattr(layout, entry.name))) is not None)
