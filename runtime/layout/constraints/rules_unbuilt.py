"""What parc build cannot generate yet that is not a pair (the pairs are unbuilt_pairs.py's rows): the
UNBUILDABLE values."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from ..rule_engine import BUILD, Violation, rule
from ..rule_keys import KEYS


@dataclass(frozen=True, slots=True)
class Unbuildable:
    name: str
    """The value (a name of ``KEYS``) that asks for the feature."""
    asked: Callable[[object], bool]
    feature: str
    instead: str


UNBUILDABLE = (
    Unbuildable("optimizer", lambda name: name != "adamw", "", "use optimizer = adamw(...)"),
)
"""One entry per feature ``parc build`` cannot generate: the issue that builds it deletes
its entry (and adds its pass). Rule kind ``BUILD``: ``parc plan`` still predicts them."""


def _unbuildable(entry: Unbuildable) -> Callable:
    def check(**values):
        value = values[entry.name]
        if not entry.asked(value):
            return None
        feature = entry.feature or f"{entry.name} {value!r}"
        return Violation(code="PAR0802", blame=(KEYS[entry.name],),
                         message=f"{feature} is not supported yet by parc build",
                         hint=f"{entry.instead}; a later version of parc generates it")

    check.__signature__ = inspect.Signature([inspect.Parameter(entry.name, inspect.Parameter.KEYWORD_ONLY)])
    return check


for _entry in UNBUILDABLE:
    rule("PAR0802", BUILD, name=f"build_{_entry.name}")(_unbuildable(_entry))
