"""The rules' engine: ``Violation``, the ``@rule`` registry and ``violations``, and the small
helpers rules and the trainer share (``per_layer``, ``entries``, ``divisors``). Torch-free,
standard library only: the trainer imports it (``model_desc``'s own checks, ``model.py``'s
per-layer values) without the rules of ``constraints/`` or the planner's side of the engine
(``rule_keys.py``: the value names, ``legal``/``holds``/``smallest``), which a build does
not ship. Note [a rule is an entry] is in ``constraints/__init__.py``.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

LAYOUT, BUILD = "layout", "build"
"""Rule kinds: what any program must satisfy; what ``parc build`` can generate today."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    code: str
    blame: tuple[str, ...]
    """Spec keys (dotted) the mistake is about: it is shown at the first one written."""
    message: str
    hint: str | None = None
    blame_latest_set: bool = False
    """Among ``blame``, point at the one a ``--set`` gave last, if any (the world size:
    the user just changed that degree)."""
    rule: str = ""
    """The name of the rule (``violations`` fills it in)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    name: str
    code: str
    kind: str
    check: Callable
    needs: tuple[str, ...]
    """Values that must be known for the rule to run."""
    optional: tuple[str, ...]


RULES: list[Rule] = []
"""Every rule, in the order their violations are reported."""


def rule(code: str, kind: str = LAYOUT, name: str | None = None):
    """Register ``check(**values) -> Violation | tuple[Violation, ...] | None`` (Note [a rule is an entry])."""

    def register(check: Callable) -> Callable:
        params = inspect.signature(check).parameters.values()
        needs = tuple(p.name for p in params if p.default is inspect.Parameter.empty)
        optional = tuple(p.name for p in params if p.default is not inspect.Parameter.empty)
        if not needs:
            raise ValueError(f"constraints: rule {check.__name__} reads nothing")
        RULES.append(Rule(name=name or check.__name__, code=code, kind=kind, check=check,
                          needs=needs, optional=optional))
        _SELECTED.clear()  # a selection made before this module's rules registered would miss them
        return check

    return register


def violations(
    values: Mapping[str, object], kinds: Iterable[str] = (LAYOUT, BUILD), touching: Iterable[str] | None = None
) -> list[Violation]:
    """Every violated rule of ``kinds`` whose required values are known, in ``RULES`` order;
    with ``touching``, only the rules that read one of those names (a search that binds
    values one level at a time re-checks only what the new values can change)."""
    return [
        replace(item, rule=entry.name)
        for entry, result in _results(values, tuple(kinds), touching)
        for item in ((result,) if isinstance(result, Violation) else result)
    ]


def _results(values: Mapping[str, object], kinds: tuple, touching: Iterable[str] | None):
    """(rule, what it returned) for each rule that ran and failed."""
    for entry in _selected(kinds, None if touching is None else tuple(touching)):
        result = _run(entry, values)
        if result is not None and result != ():
            yield entry, result


def _run(entry: Rule, values: Mapping[str, object]):
    """What ``entry``'s check returns for ``values``; None when a value it requires is unknown."""
    get = values.get
    args = {}
    for name in entry.needs:
        value = get(name) if name not in DERIVED else _run(DERIVED[name], values)
        if value is None:
            return None
        args[name] = value
    for name in entry.optional:
        args[name] = get(name) if name not in DERIVED else _run(DERIVED[name], values)
    return entry.check(**args)


DERIVED: dict = {}
"""The values rules read that are computed from others (``rule_keys.derive``: ``_run`` computes them too)."""


def reads(entry: Rule) -> set[str]:
    """``entry``'s parameters, and the inputs of the derived values among them."""
    names = {*entry.needs, *entry.optional}
    return names.union(*(DERIVED[n].needs + DERIVED[n].optional for n in names if n in DERIVED))


_SELECTED: dict[tuple, tuple[Rule, ...]] = {}


def _selected(kinds: tuple, touching: tuple | None) -> tuple[Rule, ...]:
    """The rules of ``kinds`` (that read a name of ``touching``), cached."""
    found = _SELECTED.get((kinds, touching))
    if found is None:
        found = tuple(r for r in RULES if r.kind in kinds and (touching is None or not reads(r).isdisjoint(touching)))
        _SELECTED[(kinds, touching)] = found
    return found


def _violation(code: str, blame, message: str, hint: str | None = None, **extra) -> Violation:
    blame = (blame,) if isinstance(blame, str) else tuple(blame)
    return Violation(code=code, blame=blame, message=message, hint=hint, **extra)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def some(values: list[int], near: int, limit: int = 10) -> str:
    """At most ``limit`` of ``values``, those closest to ``near``, in order."""
    chosen = sorted(sorted(values, key=lambda v: (abs(v - near), v))[:limit])
    text = ", ".join(str(v) for v in chosen)
    return text if len(values) <= limit else text + ", ..."


def entries(value) -> tuple:
    """A per-layer value's entries (Note [a rule is an entry]); a single value is one entry."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def per_layer(value, layers: int, what: str = "a per-layer value") -> tuple:
    """``value`` for each of ``layers`` blocks: a sequence of that length, or one value for
    all (the one expansion the spec, the cost model and the runtime's model share)."""
    if isinstance(value, (tuple, list)):
        if len(value) != layers:
            raise ValueError(f"{what} lists {len(value)} values for {layers} layers")
        return tuple(value)
    return (value,) * layers
