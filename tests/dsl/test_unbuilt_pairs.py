"""The one table of pairs parc build cannot generate yet (Note [an unbuilt pair is a row]).

Each row is a rule that refuses its pair with its code at the spec line, the docs'
table and `parc check --matrix` are printed from the rows, and a pair without a row is
not refused by the table.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from parc.runtime.layout import constraints
from parc.runtime.layout.constraints import SWITCHES, UNBUILT, markdown, matrix, matrix_text

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_table_is_the_rows():
    text = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- unbuilt pairs:[^\n]*-->\n(.*?)\n<!-- end of unbuilt pairs -->", text, re.S)
    assert found and found.group(1) == markdown()


def test_every_row_names_two_switches_once():
    pairs = [frozenset((row.a, row.b)) for row in UNBUILT]
    assert len(pairs) == len(set(pairs))
    for row in UNBUILT:
        assert row.a in SWITCHES and row.b in SWITCHES and row.a != row.b
        assert re.fullmatch(r"PAR0[0-9]{3}", row.code)


@pytest.mark.parametrize("row", UNBUILT, ids=[f"{r.a}-{r.b}" for r in UNBUILT])
def test_each_row_refuses_its_pair_and_only_with_both_on(row):
    """Values that turn both switches on meet the row's rule; turning either off clears it."""
    values = {"zero": 0, "zero_shard": "dp", "grad_reduce": "fp32", "experts": 0, "ep": 1, "etp": 1,
              "capacity_factor": "none", "sp": False, "cp": 1, "recompute": "none", "overlap": 1,
              "compress": "none", "compress_pp": "none", "chunks": 1, "schedule": "1f1b", "pp": 2,
              "tp_shape": (1, 4), "layer_tp": None, "layer_dp": None, "documents": "joined"}
    on = {"zero": {"zero": 2}, "zero3": {"zero": 3}, "hsdp": {"zero": 3, "zero_shard": "node"},
          "grad_reduce_bf16": {"grad_reduce": "bf16"}, "experts": {"experts": 4},
          "experts_without_ep": {"experts": 4}, "ep": {"ep": 2}, "capacity": {"capacity_factor": 1.25},
          "sp": {"sp": True}, "cp": {"cp": 2}, "recompute": {"recompute": "full"}, "overlap": {"overlap": 2},
          "compress": {"compress": "powersgd"}, "compress_pp": {"compress_pp": "lowrank"},
          "interleaved": {"chunks": 2}, "zero_bubble": {"schedule": "zero_bubble"},
          "zero_bubble_v": {"schedule": "zero_bubble_v"}, "chimera": {"schedule": "chimera"},
          "terapipe": {"schedule": "terapipe"}, "tp_2d": {"tp_shape": (2, 2)}, "layer_tp": {"layer_tp": (1, 2)},
          "layer_dp": {"layer_dp": (2, 1)}, "documents": {"documents": "separate"}}
    assert set(on) == set(SWITCHES)
    (rule,) = [r for r in constraints.RULES if r.name == f"unbuilt_{row.a}_{row.b}"]
    both = values | on[row.a] | on[row.b]
    result = constraints._run(rule, both)
    assert result is not None and result.code == row.code
    assert result.message.endswith(f"is not supported yet by parc build: {row.why}") and "{" not in result.hint
    assert result.blame == (SWITCHES[row.a].key, SWITCHES[row.b].key)
    for single in (values | on[row.a], values | on[row.b]):
        assert constraints._run(rule, single) is None


def test_the_matrix_shows_each_row_both_ways():
    cells = matrix()
    assert sum(code is not None for code in cells.values()) == 2 * len(UNBUILT)
    text = matrix_text()
    assert f"{len(UNBUILT)} of {len(SWITCHES) * (len(SWITCHES) - 1) // 2} pairs" in text
    assert len(text.splitlines()) == len(SWITCHES) + 2


def test_parc_check_prints_the_matrix(capsys):
    from parc.codegen.cli import main

    assert main(["check", "--matrix"]) == 0
    assert capsys.readouterr().out == matrix_text() + "\n"
    assert main(["check"]) == 2 and "give a spec FILE (or --matrix)" in capsys.readouterr().err
