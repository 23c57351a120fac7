"""The parser: what text becomes which tree, with which spans."""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

import pytest
from lark import Lark
from lark.exceptions import GrammarError, UnexpectedInput
from lark.lexer import Lexer

from parc.dsl import Diagnostics, ast, parse, read_text
from parc.dsl.diagnostics import Span, render_all
from parc.dsl.parse import parser
from parc.dsl.syntax_errors import EXAMPLES, match_example

ROOT = Path(__file__).resolve().parents[2]


def value_of(text: str) -> ast.Value:
    doc = parse(f"model m {{\n  key = {text}\n}}\n", "t.par")
    return doc.items[0].entries[0].value


def test_words_numbers_and_units_are_told_apart() -> None:
    assert value_of("1f1b") == ast.Name(span=value_of("1f1b").span, name="1f1b")
    assert isinstance(value_of("a100-80gb"), ast.Name)
    assert value_of("3e-4").value == 3e-4 and value_of("3e-4").text == "3e-4"
    assert value_of("1_000").value == 1000 and isinstance(value_of("1_000").value, int)
    assert value_of("-2").value == -2
    assert value_of("0.9").value == 0.9
    quantity = value_of("16 GB/s")
    assert isinstance(quantity, ast.Quantity) and quantity.unit == "GB/s"
    assert quantity.number.value == 16
    assert value_of("16GB/s").unit == "GB/s"
    assert value_of("1.5e9 FLOPS").number.value == 1.5e9
    assert value_of("true") == ast.Bool(span=value_of("true").span, value=True)
    assert isinstance(value_of("auto"), ast.Auto)


def test_strings_decode_escapes() -> None:
    assert value_of(r'"a\"b\\c\n\u00e9"').value == 'a"b\\c\né'
    assert value_of('"x # not a comment"').value == "x # not a comment"


def test_calls_lists_and_tuples() -> None:
    call = value_of('tokens("x.bin", dtype = uint32)')
    assert isinstance(call, ast.Call) and call.name == "tokens"
    assert [a.name for a in call.arguments] == [None, "dtype"]
    assert isinstance(value_of("(0.9, 0.95)"), ast.TupleValue)
    assert len(value_of("[1, 2, 3,]").items) == 3
    assert value_of("adamw()").arguments == ()


def test_a_call_may_span_lines_with_comments() -> None:
    doc = parse(
        "train {\n  optimizer = adamw(\n    lr = 3e-4,  # peak\n    betas = (0.9,\n"
        "             0.95),\n  )\n  steps = 3\n}\n",
        "t.par",
    )
    entries = doc.items[0].entries
    assert [e.key for e in entries] == ["optimizer", "steps"]
    assert entries[0].span.line == 2 and entries[0].span.end_line == 6
    assert [c.text for c in doc.comments] == ["# peak"]


def test_spans_are_one_based_and_end_exclusive() -> None:
    doc = parse("# c\nmodel gpt {\n  layers = 12\n}\n", "g.par")
    block = doc.items[0]
    assert block.kind_span == Span(file="g.par", line=2, column=1, end_line=2, end_column=6)
    assert block.name_span == Span(file="g.par", line=2, column=7, end_line=2, end_column=10)
    entry = block.entries[0]
    assert entry.key_span == Span(file="g.par", line=3, column=3, end_line=3, end_column=9)
    assert entry.value.span == Span(file="g.par", line=3, column=12, end_line=3, end_column=14)
    assert block.span.end_line == 4
    assert doc.comments[0].span == Span(file="g.par", line=1, column=1, end_line=1, end_column=4)


def test_every_node_has_a_span() -> None:
    doc = parse(read_text(str(ROOT / "examples" / "gpt2-small.par")), "g.par")

    def walk(node):
        if isinstance(node, tuple):
            for item in node:
                walk(item)
        elif dataclasses.is_dataclass(node) and not isinstance(node, Span):
            assert isinstance(node.span, Span) and node.span.line >= 1, node
            for field in dataclasses.fields(node):
                walk(getattr(node, field.name))

    walk(doc)


def test_nodes_are_frozen() -> None:
    doc = parse("mesh {\n  nodes = 1\n}\n", "t.par")
    with pytest.raises(dataclasses.FrozenInstanceError):
        doc.items = ()  # type: ignore[misc]


def test_crlf_tabs_and_a_byte_order_mark() -> None:
    doc = parse("\ufeffmesh {\r\n\tnodes = 1\r\n}\r\n", "t.par")
    assert doc.items[0].entries[0].value.value == 1
    assert doc.items[0].entries[0].key_span.column == 2


def test_one_line_block_and_empty_file() -> None:
    assert parse("mesh { nodes = 1 }", "t.par").items[0].entries[0].key == "nodes"
    assert parse("", "t.par").items == ()
    assert parse("# only a comment", "t.par").comments[0].text == "# only a comment"


def test_not_utf8_is_a_diagnostic(tmp_path) -> None:
    path = tmp_path / "bad.par"
    path.write_bytes(b"model m {\n  arch = g\xffpt\n}\n")
    with pytest.raises(Diagnostics) as caught:
        read_text(str(path))
    assert render_all(caught.value.errors, caught.value.sources) == (
        f"{path}:2:11: error[PAR0001]: the file is not UTF-8 text (byte 0xff)\n"
        "  2 |   arch = g\ufffdpt\n"
        "    |           ^\n"
        "  hint: save the spec as UTF-8\n"
        "\n"
        "1 error\n"
    )


def test_lone_surrogates_are_a_diagnostic() -> None:
    with pytest.raises(Diagnostics) as caught:
        parse("mesh {\n  a = \ud800\n}\n", "t.par")
    assert caught.value.errors[0].code == "PAR0001"
    assert caught.value.errors[0].span.line == 2


class _NoLexer(Lexer):
    def __init__(self, conf) -> None:
        pass

    def lex(self, data):  # pragma: no cover - never called
        raise NotImplementedError


def strict_lalr(grammar: str, **kw) -> Lark:
    """LALR tables built in strict mode: a shift/reduce conflict is an error. (The
    lexer is stubbed: lark's strict lexer check needs the optional interegular.)"""
    return Lark(grammar, parser="lalr", lexer=_NoLexer, strict=True, **kw)


def test_grammar_has_no_conflicts() -> None:
    grammar = resources.files("parc.dsl").joinpath("grammar.lark").read_text(encoding="utf-8")
    strict_lalr(grammar, start=["start", "override"])


def test_the_conflict_check_can_fail() -> None:
    with pytest.raises(GrammarError):
        strict_lalr('start: "if" start ("else" start)? | "x"\n')


@pytest.mark.parametrize(
    "label,example", [(label, ex) for label, examples in EXAMPLES.items() for ex in examples]
)
def test_each_mistake_example_is_recognised(label: str, example: str) -> None:
    lark, _ = parser()
    with pytest.raises(UnexpectedInput) as caught:
        lark.parse(example, start="start")
    assert match_example(caught.value) == label
