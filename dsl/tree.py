"""Parsed words and brackets → the AST of ``dsl/ast.py``.

Takes: what a parser found: each word (lark's ATOM, QUANTITY, STRING) with its
line and column, the positions of brackets and braces, and the comments its
lexer collected. Gives: ``AstBuilder``, which makes the ``ast`` nodes, each with
its span, and ``TreeToAst``, which feeds it lark's parse tree. Both parsers of
``dsl/parse.py`` (lark's, and the quick one of ``dsl/quick_parse.py``) build
through ``AstBuilder``, so they make the same nodes and errors by construction.

Here each word is classified as a number (``3e-4``, ``1_000``), a name (``1f1b``,
``a100-80gb``), ``true``/``false``/``auto``, or a key (units are looked up later, in
``dsl/normalize.py``, so an unknown one is reported with the file's other errors), and
strings decoded. Problems are collected in ``errors``, not raised, so one file
reports all of them. Before: ``dsl/parse.py``. After: ``dsl/normalize.py``.

A word never spans lines (no terminal of the grammar holds a newline but ``_NL``),
so a word is given as its text, line and column; its span ends ``len(text)``
columns later on the same line.
"""

from __future__ import annotations

import re

from lark import Token, Transformer, v_args

from . import ast
from .diagnostics import ParcError, Span, clip
from .grammar import KEY_RE
from .numbers import NUMBER_RE, NumberError, read_number
from .source import LineIndex

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r"}
_span_at = Span.at


class AstBuilder:
    """Makes ast nodes from positions; collects errors in ``self.errors``."""

    def __init__(self, file: str, lines: LineIndex, comments: list[tuple[int, int, str]]):
        self.file = file
        self.lines = lines
        self.comments = comments
        self.errors: list[ParcError] = []

    def span(self, line: int, column: int, end_line: int, end_column: int) -> Span:
        """The one place a Span is made from parser positions (Note [fast spans])."""
        return _span_at(self.file, line, column, end_line, end_column)

    def word_span(self, text: str, line: int, column: int) -> Span:
        return _span_at(self.file, line, column, line, column + len(text))

    def _error(self, span: Span, code: str, message: str, hint: str | None = None) -> None:
        self.errors.append(ParcError(span=span, code=code, message=message, hint=hint))

    def key(self, text: str, line: int, column: int, what: str) -> str:
        """``text`` as a key, block or function name; PAR0015 if it is not one."""
        if not KEY_RE.fullmatch(text):
            self._error(
                self.word_span(text, line, column),
                "PAR0015",
                f"`{clip(text)}` is not a valid {what}",
                f"a {what} is letters, digits and `_`, not starting with a digit",
            )
        return text

    # --- top level -------------------------------------------------------------
    def document(self, items: tuple) -> ast.Document:
        lines = self.lines.lines
        span = self.span(1, 1, len(lines), len(lines[-1]) + 1)
        comments = ast.comments_at(self.file, self.comments)
        return ast.Document(span=span, items=items, comments=comments)

    def block(self, kind: str, kind_line: int, kind_column: int, label, entries: tuple,
              end_line: int, end_column: int) -> ast.Block:
        """``kind label { entries }``; ``label`` is ``(text, line, column)`` or None;
        the block ends where its ``}`` does, at ``end_line``, ``end_column``."""
        name = name_span = None
        if label is not None:
            name = self.key(*label, "block name")
            name_span = self.word_span(*label)
        return ast.Block(
            span=self.span(kind_line, kind_column, end_line, end_column),
            kind=self.key(kind, kind_line, kind_column, "block name"),
            kind_span=self.word_span(kind, kind_line, kind_column),
            name=name,
            name_span=name_span,
            entries=entries,
        )

    def block_assign(self, kind: str, line: int, column: int, value) -> ast.BlockAssign:
        end = value.span
        return ast.BlockAssign(
            span=self.span(line, column, end.end_line, end.end_column),
            kind=self.key(kind, line, column, "block name"),
            kind_span=self.word_span(kind, line, column),
            value=value,
        )

    def entry(self, key: str, line: int, column: int, value) -> ast.Entry:
        end = value.span
        return ast.Entry(
            span=self.span(line, column, end.end_line, end.end_column),
            key=self.key(key, line, column, "key"),
            key_span=self.word_span(key, line, column),
            value=value,
        )

    # --- values ----------------------------------------------------------------
    def atom(self, text: str, line: int, column: int):
        span = self.word_span(text, line, column)
        if text == "true" or text == "false":
            return ast.Bool(span=span, value=text == "true")
        if text == "auto":
            return ast.Auto(span=span)
        if NUMBER_RE.fullmatch(text):
            return self._number(text, span)
        if NAME_RE.fullmatch(text):
            return ast.Name(span=span, name=text)
        if text[0] in "+-.0123456789":
            self._error(
                span,
                "PAR0011",
                f"malformed number `{clip(text)}`",
                "numbers look like 4, 1_000, 0.9 or 3e-4",
            )
        else:
            self._error(
                span,
                "PAR0011",
                f"`{clip(text)}` is not a valid name",
                'names are letters, digits, `_` and `-`; write a path as a string: "data/x.bin"',
            )
        return ast.Name(span=span, name=text)

    def _number(self, text: str, span: Span) -> ast.Number:
        try:
            value = read_number(text, f"`{clip(text)}`")
        except NumberError as exc:
            self._error(span, "PAR0011", exc.message, exc.hint)
            value = 0
        return ast.Number(span=span, value=value, text=text)

    def quantity(self, text: str, line: int, column: int) -> ast.Quantity:
        number_text = NUMBER_RE.match(text).group()
        unit = text[len(number_text) :].lstrip(" \t")
        unit_column = column + len(text) - len(unit)
        unit_span = self.word_span(unit, line, unit_column)  # an unknown unit: normalize.py says so
        return ast.Quantity(
            span=self.word_span(text, line, column),
            number=self._number(number_text, self.word_span(number_text, line, column)),
            unit=unit,
            unit_span=unit_span,
        )

    def string(self, text: str, line: int, column: int) -> ast.String:
        return ast.String(span=self.word_span(text, line, column), value=self._decode(text, line, column))

    def _decode(self, text: str, line: int, token_column: int) -> str:
        body = text[1:-1]
        if "\\" not in body:
            return body
        out: list[str] = []
        i = 0
        while i < len(body):
            char = body[i]
            if char != "\\":
                out.append(char)
                i += 1
                continue
            escape = body[i + 1]
            column = token_column + 1 + i
            if escape in _ESCAPES:
                out.append(_ESCAPES[escape])
                i += 2
                continue
            digits = body[i + 2 : i + 6]
            if escape == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", digits):
                code = int(digits, 16)
                if not 0xD800 <= code <= 0xDFFF:
                    out.append(chr(code))
                    i += 6
                    continue
            width = 6 if escape == "u" else 2
            self._error(
                self.span(line, column, line, column + width),
                "PAR0013",
                f"unknown escape `{body[i:i + width]}` in a string",
                'escapes are \\\\ \\" \\n \\t \\r and \\uXXXX (not a surrogate)',
            )
            i += 2
        return "".join(out)

    def list_value(self, items: tuple, span: Span) -> ast.ListValue:
        """``[items]``; ``span`` runs from ``[`` to ``]``."""
        return ast.ListValue(span=span, items=items)

    def tuple_value(self, items: tuple, span: Span) -> ast.TupleValue:
        """``(items)``; ``span`` runs from ``(`` to ``)``."""
        return ast.TupleValue(span=span, items=items)

    def call(self, name: str, line: int, column: int, arguments: tuple,
             end_line: int, end_column: int) -> ast.Call:
        """``name(arguments)``, its ``)`` ending at ``end_line``, ``end_column``."""
        seen_keyword = False
        for argument in arguments:
            if argument.name is not None:
                seen_keyword = True
            elif seen_keyword:
                self._error(
                    argument.span,
                    "PAR0014",
                    f"positional argument after a keyword argument in `{name}(...)`",
                    "give it by name, or move it before the keyword arguments",
                )
        return ast.Call(
            span=self.span(line, column, end_line, end_column),
            name=self.key(name, line, column, "function name"),
            name_span=self.word_span(name, line, column),
            arguments=arguments,
        )

    def positional(self, value) -> ast.Argument:
        return ast.Argument(span=value.span, name=None, name_span=None, value=value)

    def keyword(self, name: str, line: int, column: int, value) -> ast.Argument:
        end = value.span
        return ast.Argument(
            span=self.span(line, column, end.end_line, end.end_column),
            name=self.key(name, line, column, "argument name"),
            name_span=self.word_span(name, line, column),
            value=value,
        )


def _word(token: Token) -> tuple[str, int, int]:
    return str(token), token.line, token.column


@v_args(meta=True)
class TreeToAst(Transformer):
    """Lark tree → ast nodes, through an ``AstBuilder`` (``self.build``)."""

    def __init__(self, build: AstBuilder):
        super().__init__(visit_tokens=False)
        self.build = build

    def _meta_span(self, meta) -> Span:
        return self.build.span(meta.line, meta.column, meta.end_line, meta.end_column)

    def start(self, meta, children):
        return self.build.document(tuple(child for child in children if child is not None))

    def block(self, meta, children):
        kind, *label, body = children
        return self.build.block(
            *_word(kind), _word(label[0]) if label else None, body, meta.end_line, meta.end_column
        )

    def block_assign(self, meta, children):
        kind, value = children
        return self.build.block_assign(*_word(kind), value)

    def body(self, meta, children):
        return tuple(children)

    def entry(self, meta, children):
        key, value = children
        return self.build.entry(*_word(key), value)

    def override(self, meta, children):
        key, value = children
        return key, value

    def atom(self, meta, children):
        return self.build.atom(*_word(children[0]))

    def quantity(self, meta, children):
        return self.build.quantity(*_word(children[0]))

    def string(self, meta, children):
        return self.build.string(*_word(children[0]))

    def list(self, meta, children):
        return self.build.list_value(children[0] or (), self._meta_span(meta))

    def tuple(self, meta, children):
        return self.build.tuple_value(children[0] or (), self._meta_span(meta))

    def elements(self, meta, children):
        return tuple(children)

    def call(self, meta, children):
        name, arguments = children
        return self.build.call(*_word(name), arguments or (), meta.end_line, meta.end_column)

    def arguments(self, meta, children):
        return tuple(children)

    def positional(self, meta, children):
        return self.build.positional(children[0])

    def keyword(self, meta, children):
        name, value = children
        return self.build.keyword(*_word(name), value)
