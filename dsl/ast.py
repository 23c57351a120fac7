"""The syntax tree of a ``.par`` file.

Takes: nothing (leaf module; built by ``dsl/parse.py``). Gives: frozen node classes,
each with the ``Span`` of the text it came from, and ``strip_spans`` for comparing
trees while ignoring positions (``parse(fmt(x)) == parse(x)`` modulo spans).
``dsl/fmt.py`` prints a tree back as canonical text; ``dsl/normalize.py`` turns it
into the normalized JSON document that ``dsl/validate.py`` checks.

The tree records what was written, not what it means: ``3e-4`` is a ``Number``
with its text, ``16 GB/s`` a ``Quantity`` whose unit is resolved later, ``1f1b`` a
``Name``. ``true``/``false`` are ``Bool`` and ``auto`` is ``Auto``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Union

from .diagnostics import Span

NO_SPAN = Span(file="", line=0, column=0, end_line=0, end_column=0)
"""What ``strip_spans`` puts in place of every span."""


def span_between(file: str, first, last=None) -> Span:
    """A Span from lark's positions, for syntax errors and ``--set`` keys (the AST's
    spans are made by ``AstBuilder.span`` in ``dsl/tree.py``).

    ``first`` and ``last`` are anything with ``line``/``column``/``end_line``/
    ``end_column`` (a lark ``Token`` or ``Meta``, or a ``Span``); the span runs from the
    start of ``first`` to the end of ``last`` (or of ``first``).
    """
    last = first if last is None else last
    return Span(
        file=file,
        line=first.line,
        column=first.column,
        end_line=last.end_line,
        end_column=last.end_column,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Number:
    span: Span
    value: int | float
    text: str
    """As written (``3e-4``, ``1_000``); the formatter prints it unchanged."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Quantity:
    """A number with a unit: ``16 GB/s``, ``80 GiB``, ``5 us``."""

    span: Span
    number: Number
    unit: str
    unit_span: Span


@dataclass(frozen=True, slots=True, kw_only=True)
class String:
    span: Span
    value: str
    """The decoded text (escapes resolved)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Name:
    """A bare word: a preset or an enum value (``gpt``, ``1f1b``, ``a100-80gb``)."""

    span: Span
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Bool:
    span: Span
    value: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Auto:
    """``auto``: left to the planner."""

    span: Span


@dataclass(frozen=True, slots=True, kw_only=True)
class ListValue:
    span: Span
    items: tuple["Value", ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TupleValue:
    span: Span
    items: tuple["Value", ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Argument:
    """One argument of a call: positional (``name`` is None) or ``name = value``."""

    span: Span
    name: str | None
    name_span: Span | None
    value: "Value"


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """``adamw(lr = 3e-4)``, ``interleaved(chunks = 2)``, ``tokens("data/x.bin")``."""

    span: Span
    name: str
    name_span: Span
    arguments: tuple[Argument, ...]


Value = Union[Number, Quantity, String, Name, Bool, Auto, ListValue, TupleValue, Call]


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """``key = value`` inside a block."""

    span: Span
    key: str
    key_span: Span
    value: Value
    repeated: int = 0
    """How many more entries of this key stood between the last one built and this one and
    were counted, not built (Note [duplicates counted] in quick_parse.py)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """``model NAME { ... }``, ``mesh { ... }``: ``kind``, optional ``name``, entries."""

    span: Span
    kind: str
    kind_span: Span
    name: str | None
    name_span: Span | None
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockAssign:
    """A whole block given as one value: ``parallel = auto``."""

    span: Span
    kind: str
    kind_span: Span
    value: Value


@dataclass(frozen=True, slots=True, kw_only=True)
class Comment:
    """``# text``; ``text`` includes the ``#`` and has no trailing blanks."""

    span: Span
    text: str


def comments_at(file: str, found) -> tuple[Comment, ...]:
    """``Comment``s of ``(line, column, text)`` triples in ``file``, made quickly: a
    file may hold a million (Note [fast spans] in ``dsl/diagnostics.py``)."""
    new, set_span, set_text, on_line = (
        object.__new__,
        Comment.span.__set__,
        Comment.text.__set__,
        Span.on_line,
    )
    out = []
    for line, column, text in found:
        comment = new(Comment)
        set_span(comment, on_line(file, line, column, column + len(text)))
        set_text(comment, text)
        out.append(comment)
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class Document:
    span: Span
    items: tuple[Block | BlockAssign, ...]
    comments: tuple[Comment, ...]
    """Every comment of the file, in order; ``fmt`` places them back by position."""


Node = Union[Value, Argument, Entry, Block, BlockAssign, Comment, Document]


def strip_spans(node):
    """A copy of ``node`` with every span replaced by ``NO_SPAN``, for comparisons."""
    if isinstance(node, tuple):
        return tuple(strip_spans(item) for item in node)
    if isinstance(node, Span):
        return NO_SPAN
    if not dataclasses.is_dataclass(node):
        return node
    changes = {f.name: strip_spans(getattr(node, f.name)) for f in dataclasses.fields(node)}
    return type(node)(**changes)
