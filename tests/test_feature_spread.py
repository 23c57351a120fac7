"""How many files of the compiler and the runtime name each feature word (issue 32).

The issue's target is at most 8 non-test files per word (a feature's facts in its
registry entry, codegen/features.py and runtime/layout's rules, its transform and its
cost). Today's counts are far above it; this test holds each where it is measured, so a
change may lower a count (then lower its ceiling here) but never raise it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CEILING = {
    "cp_kind": 8, "etp": 13, "tp_shape": 12, "terapipe": 11, "chimera": 9, "compress_pp": 9, "zero_shard": 9,
    "ep_group": 8,
}
"""Measured on 2026-12-06 once the layout's options are one record (dsl/keys/layout_options.py:
the key, the spec's and the planner's field and the Plan's cited field written once) and the
runtime's generic files say what they do rather than which feature asks it. What is left is each
word's owners: its record entry, registry entry, rules and unbuilt-pair rows, runtime, render and
cost modules, and for etp/tp_shape/zero_shard/compress_pp the pair rules in rules_unbuilt.py /
rules_hetero.py / rules_overlap.py / rules_pipeline.py, whose order in the rule list is the order
errors print in."""


def files_naming(word: str) -> list[str]:
    pattern = re.compile(rf"\b{re.escape(word)}\b")
    found = []
    for folder in ("dsl", "codegen", "runtime", "templates"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".j2") and pattern.search(path.read_text(encoding="utf-8")):
                found.append(path.relative_to(ROOT).as_posix())
    return sorted(found)


def test_no_feature_word_spreads_further():
    spread = {word: len(files_naming(word)) for word in CEILING}
    grown = {word: (n, CEILING[word]) for word, n in spread.items() if n > CEILING[word]}
    assert not grown, f"(files, ceiling) — put the new use in the feature's entry instead: {grown}"
