"""The formatter: canonical text, idempotent, meaning-preserving; and the tree dump."""

from __future__ import annotations

from pathlib import Path

import pytest

from parc.dsl import dump, format_document, load, parse, strip_spans

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "examples").glob("*.par"))


def fmt(text: str) -> str:
    return format_document(parse(text, "t.par"))


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_example_is_canonical_and_round_trips(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert fmt(text) == text, f"{path.name} is not in canonical form: run parc fmt"
    assert strip_spans(parse(fmt(text), "t.par")) == strip_spans(parse(text, "t.par"))
    load(str(path))


def test_there_are_the_four_examples() -> None:
    names = {p.name for p in SPECS}
    assert {"tiny.par", "gpt2-small.par", "llama-7b.par", "gpt3-175b.par"} <= names


MESSY = """\
# header
# second line


model   gpt_tiny {   # the model
    arch    = gpt          # gpt | llama


  layers=4
  # about hidden
  hidden  = 128
  optimizer = adamw(lr = 3e-4, # peak
     betas = (0.9,0.95),)   # tail
  bandwidth = 16GB/s
  name = "a\\"b"
  one = (1)
  list = [ 1,2 , 3, ]
}
# between
mesh {
  nodes = 1 }
parallel = auto   # all
train {}
train {

  # only a comment

}
# end
"""

CANONICAL = """\
# header
# second line

model gpt_tiny {  # the model
  arch = gpt  # gpt | llama

  layers = 4
  # about hidden
  hidden = 128
  # peak
  optimizer = adamw(lr = 3e-4, betas = (0.9, 0.95))  # tail
  bandwidth = 16 GB/s
  name = "a\\"b"
  one = (1,)
  list = [1, 2, 3]
}

# between
mesh {
  nodes = 1
}

parallel = auto  # all

train {}

train {
  # only a comment
}

# end
"""


def test_canonical_form() -> None:
    assert fmt(MESSY) == CANONICAL


def test_idempotent_and_meaning_preserving() -> None:
    assert fmt(CANONICAL) == CANONICAL
    assert strip_spans(parse(MESSY, "t.par")) == strip_spans(parse(CANONICAL, "t.par"))


def test_strings_are_re_escaped() -> None:
    assert fmt('m {\n  s = "tab\\there\\u0001"\n}\n') == 'm {\n  s = "tab\\there\\u0001"\n}\n'


def test_strip_spans_sees_real_differences() -> None:
    a = parse("mesh {\n  nodes = 1\n}\n", "a.par")
    b = parse("\n\nmesh {\n  nodes = 2\n}\n", "b.par")
    c = parse("\n\nmesh {\n  nodes   =   1\n}\n", "c.par")
    assert strip_spans(a) != strip_spans(b)
    assert strip_spans(a) == strip_spans(c)
    assert a != c  # the spans differ


def test_dump() -> None:
    doc = parse("# hi\nmodel m {\n  a = f(1, x = [2 GB])\n}\nparallel = auto\n", "t.par")
    assert dump(doc) == (
        "Document t.par\n"
        "  Block model m @2:1\n"
        "    Entry a @3:3\n"
        "      Call f @3:7\n"
        "        Number 1 @3:9\n"
        "        x = ListValue @3:16\n"
        "          Quantity 2 GB @3:17\n"
        "  BlockAssign parallel @5:1\n"
        "    Auto auto @5:12\n"
        "  Comment '# hi' @1:1\n"
    )
