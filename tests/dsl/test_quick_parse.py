"""The quick parser (``dsl/quick_parse.py``) reads exactly what lark reads: on every
example, every bad input and the texts below it either gives up or gives lark's
answer (nodes, spans, comments, errors). ``tests/dsl/test_fuzz.py`` checks the same
on fuzzed texts (``agrees`` is called by its ``answers``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from parc.dsl import Diagnostics, parse
from parc.dsl.quick_parse import quick_parse
from parc.dsl.source import LineIndex, MAX_NESTING
from parc.dsl.tree import AstBuilder

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.par"))
BAD = sorted((ROOT / "tests" / "dsl" / "bad").glob("*.par"))


def outcome(text: str, quick: bool):
    """The Document, or every error with its span and words."""
    try:
        return parse(text, "f.par", quick=quick)
    except Diagnostics as exc:
        return [(e.span, e.code, e.message, e.hint) for e in exc.errors]


def agrees(text: str) -> None:
    assert outcome(text, quick=True) == outcome(text, quick=False)


def taken(text: str) -> bool:
    """Whether the quick parser reads ``text`` (rather than giving up)."""
    return quick_parse(text, AstBuilder("f.par", LineIndex(text), []), True) is not None


@pytest.mark.parametrize("path", EXAMPLES + BAD, ids=lambda p: p.name)
def test_agrees_with_lark(path: Path) -> None:
    agrees(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_reads_every_example(path: Path) -> None:
    assert taken(path.read_text(encoding="utf-8"))


WELL_FORMED = [
    "",
    "\n\n",
    "# only a comment",
    "  # indented\n\n# two\n",
    "mesh {}",
    "mesh { }\nparallel = auto",
    "model m { a = 1 }",
    "train {\n  optimizer = adamw(lr = 3e-4, betas = (0.9, 0.95),)  # c\n}\n",
    "train {\n  x = [\n    1,  # one\n    2,\n  ]\n  y = (1,)\n  z = ()\n  w = []\n}",
    'train {\n  data = tokens("a\\tb\\u00e9")\n  bw = 16 GB/s\n  t = 5us\n}',
    "mesh {\n  device = a100-80gb\n  s = 1f1b\n  b = true\n  n = -1_000\n}",
    "train { f = g(h(1), k = [x(y = 2)]) }",
    "mesh{a=1}\n#x\nmodel m{\n\n}",
    "train {\n  a = 1e999\n  b = 1zz\n  c = \"\\q\"\n  9k = 1\n  d = f(k = 1, 2)\n}",
]
GIVES_UP = [
    "16 GB { }",  # lark's lexer reads the block `16` named `GB` here
    "mesh { 9k = 1 }\n16 GB { }",  # PAR0015 once: errors found before giving up are not kept
    "mesh { 16 GB = 1 }",
    "mesh { a = 1 b = 2 }",
    "mesh { a = }",
    "mesh {",
    "mesh { a = [1 2] }",
    "mesh { a = f(,) }",
    "mesh { a = \"open }",
    "mesh { a = 1 } ;",
    "mesh { a = 1 }" + " " * 100_000 + ";",  # in linear time: no backtracking into blanks
    "mesh { a = " + "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1) + " }",
]


@pytest.mark.parametrize("text", WELL_FORMED)
def test_reads_well_formed_texts_as_lark_does(text: str) -> None:
    assert taken(text)
    agrees(text)


@pytest.mark.parametrize("text", GIVES_UP)
def test_gives_up_where_lark_must_decide(text: str) -> None:
    assert not taken(text)
    agrees(text)


def test_deepest_nesting_is_read() -> None:
    text = "mesh { a = " + "[" * MAX_NESTING + "]" * MAX_NESTING + " }"
    assert taken(text)
    agrees(text)
