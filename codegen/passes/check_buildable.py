"""Pass 2: the layout, planner's choices included, obeys every rule and asks only for
what ``parc build`` can generate today.

Takes: a ``Spec`` whose values passed ``check_values`` and whose ``auto`` values the
planner filled (``choose_layout``). Gives: the draft unchanged, or ``Diagnostics``
naming every violated rule of ``runtime/layout/constraints/`` at its spec line with a hint:
the layout rules again (so the planner's winner is re-checked) and the ``BUILD``
rules, one ``constraints.UNBUILDABLE`` entry per feature not generated yet (PAR0802;
the issue that implements one deletes its entry and adds its pass). ``parc check``
applies the same rules to the written values, so it refuses what this pass refuses.

Before: ``choose_layout``. After: ``resolve_mesh``.
"""

from __future__ import annotations

from parc.dsl.spec import Spec

from ..errors import check
from ..spec_values import rule_errors
from .draft import Draft


def run(spec: Spec, draft: Draft) -> Draft:
    # Values left auto were filled by choose_layout (the planner) before this pass.
    check(rule_errors(spec))
    return draft
