"""The front end answers any input with a Document/Spec or Diagnostics: never another
exception, never a hang. Random text and bytes, and the examples with tokens deleted,
duplicated, swapped and inserted. The quick parser gives up or agrees with lark.
Where the text parses, ``fmt`` is idempotent and keeps its meaning. Deterministic
(``derandomize``) so CI sees the same inputs.
"""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parc.dsl import Diagnostics, decode, format_document, load_text, parse, strip_spans
from test_quick_parse import agrees  # tests/dsl is on sys.path (pytest's default import mode)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {
    p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "examples").glob("*.par"))
}
TOKEN = re.compile(r'\s+|"[^"\n]*"|[A-Za-z0-9_.+\-/]+|.', re.S)
POOL = sorted({t for text in EXAMPLES.values() for t in TOKEN.findall(text)}) + [
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    "=",
    "\n",
    '"',
    "#",
    "auto",
    "1f1b",
    "3e-4",
    "GB/s",
    "\\",
    "'",
    ";",
    "\t",
    "\r",
    "\ufeff",
    "é",
    "𝔁",
    "1e999",
    "0x1F",
    "-",
    "..",
    "__",
]

COMMENTS = ["  # c", "\n", "\n\n", "\n# x", "\n  # y", "# in\n   ", "\n\n  # z\n"]

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,  # no timing assertions in tests: a loaded machine is not a slow parser
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
SPEC_CHARS = st.sampled_from(
    list(string.ascii_letters + string.digits + "{}()[]=,#\"\\\n \t.-+_/;'")
)


def answers(text: str, file: str = "f.par", overrides=()) -> None:
    """The property: a Spec or Diagnostics; and when it parses, fmt behaves."""
    try:
        load_text(text, file, overrides)
    except Diagnostics as exc:
        assert exc.errors, "Diagnostics without errors"
        for error in exc.errors:
            assert error.code.startswith("PAR") and error.span.line >= 1
    if file.endswith(".json"):
        return
    agrees(text)
    try:
        doc = parse(text, file)
    except Diagnostics:
        return
    canonical = format_document(doc)
    again = parse(canonical, file)
    assert format_document(again) == canonical, "fmt is not idempotent"
    assert strip_spans(again) == strip_spans(doc), "fmt changed the meaning"


@settings(FUZZ, max_examples=1000)
@given(st.text(SPEC_CHARS, max_size=300) | st.text(max_size=100))
def test_random_text(text: str) -> None:
    answers(text)


@settings(FUZZ, max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    try:
        text = decode(data, "f.par")
    except Diagnostics as exc:
        assert exc.errors[0].code == "PAR0001"
        return
    answers(text)


@settings(FUZZ, max_examples=300)
@given(st.text(SPEC_CHARS, max_size=200))
def test_random_json(text: str) -> None:
    answers(text, "f.json")


def mutate(text: str, data) -> str:
    tokens = TOKEN.findall(text)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        i = data.draw(st.integers(0, len(tokens) - 1), label="at")
        op = data.draw(
            st.sampled_from(["delete", "duplicate", "swap", "insert", "comment"]), label="op"
        )
        if op == "delete":
            del tokens[i]
        elif op == "duplicate":
            tokens.insert(i, tokens[i])
        elif op == "swap":
            j = data.draw(st.integers(0, len(tokens) - 1), label="with")
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif op == "insert":
            tokens.insert(i, data.draw(st.sampled_from(POOL), label="token"))
        else:  # a comment or line break where one may go: end of line, inside brackets
            spots = [
                k for k, t in enumerate(tokens) if t.startswith("\n") or tokens[k - 1] in "(,["
            ]
            if spots:
                at = data.draw(st.sampled_from(spots), label="spot")
                tokens.insert(at, data.draw(st.sampled_from(COMMENTS), label="comment"))
        if not tokens:
            break
    return "".join(tokens)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@settings(FUZZ, max_examples=400)
@given(data=st.data())
def test_mutated_examples(name: str, data) -> None:
    answers(mutate(EXAMPLES[name], data))


KEYS = [
    "parallel.tp",
    "parallel.dp",
    "parallel",
    "mesh.intra_node",
    "train.data",
    "parallel.schedule",
    "model.name",
    "model.layers",
    "train.schedule",
    "x.y",
    "",
    "a.b.c",
]
VALUES = [
    "2",
    "3",
    "auto",
    "300 GB/s",
    "80 GiB",
    'tokens("x")',
    "interleaved(chunks = 2)",
    "(",
    "",
    "true",
    "gpt",
    "[1, 2]",
    "cosine(warmup = 100)",
    "1e999",
    '"',
    "1 2",
]


@settings(FUZZ, max_examples=400)
@given(
    st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)), max_size=4),
    st.lists(st.text(SPEC_CHARS, max_size=30), max_size=2),
)
def test_random_overrides(pairs, raw) -> None:
    overrides = [f"{k}={v}" for k, v in pairs] + raw
    answers(EXAMPLES["tiny.par"], "tiny.par", overrides)
    answers(EXAMPLES["gpt3-175b.par"], "g.par", overrides)
