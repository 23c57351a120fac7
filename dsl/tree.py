"""Lark's parse tree → the AST of ``dsl/ast.py``.

Takes: the tree ``dsl/parse.py`` got from lark, and the comments its post-lexer
collected. Gives: ``ast`` nodes, each with its span (made by ``ast.span_between``).
Here each word (lark's ATOM) is classified as a number (``3e-4``, ``1_000``), a name
(``1f1b``, ``a100-80gb``), ``true``/``false``/``auto``, or a key; units are looked
up and strings decoded. Problems are collected in ``errors``, not raised, so one
file reports all of them. Before: ``dsl/parse.py``. After: ``dsl/normalize.py``.
"""

from __future__ import annotations

import re

from lark import Token, Transformer, v_args

from . import ast
from .ast import span_between
from .diagnostics import ParcError, clip
from .grammar import KEY_RE
from .numbers import NUMBER_RE, NumberError, read_number
from .source import LineIndex
from .units import UNITS, suggest_unit

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r"}


@v_args(meta=True)
class TreeToAst(Transformer):
    """Lark tree → ast nodes; collects errors in ``self.errors`` instead of raising."""

    def __init__(self, file: str, lines: LineIndex, comments: list[tuple[int, int, str]]):
        super().__init__(visit_tokens=False)
        self.file = file
        self.lines = lines
        self.comments = comments
        self.errors: list[ParcError] = []

    def _span(self, first, last=None) -> ast.Span:
        return span_between(self.file, first, last)

    def _error(self, span: ast.Span, code: str, message: str, hint: str | None = None) -> None:
        self.errors.append(ParcError(span=span, code=code, message=message, hint=hint))

    def _key(self, token: Token, what: str) -> str:
        if not KEY_RE.fullmatch(token):
            self._error(
                self._span(token),
                "PAR0015",
                f"`{clip(str(token))}` is not a valid {what}",
                f"a {what} is letters, digits and `_`, not starting with a digit",
            )
        return str(token)

    # --- top level -------------------------------------------------------------
    def start(self, meta, children):
        items = tuple(child for child in children if child is not None)
        lines = self.lines.lines
        span = ast.Span(
            file=self.file, line=1, column=1, end_line=len(lines), end_column=len(lines[-1]) + 1
        )
        comments = ast.comments_at(self.file, self.comments)
        return ast.Document(span=span, items=items, comments=comments)

    def block(self, meta, children):
        kind, *label, body = children
        name = self._key(label[0], "block name") if label else None
        return ast.Block(
            span=self._span(meta),
            kind=self._key(kind, "block name"),
            kind_span=self._span(kind),
            name=name,
            name_span=self._span(label[0]) if label else None,
            entries=body,
        )

    def block_assign(self, meta, children):
        kind, value = children
        return ast.BlockAssign(
            span=self._span(meta),
            kind=self._key(kind, "block name"),
            kind_span=self._span(kind),
            value=value,
        )

    def body(self, meta, children):
        return tuple(children)

    def entry(self, meta, children):
        key, value = children
        return ast.Entry(
            span=self._span(meta), key=self._key(key, "key"), key_span=self._span(key), value=value
        )

    def override(self, meta, children):
        key, value = children
        return key, value

    # --- values ----------------------------------------------------------------
    def atom(self, meta, children):
        (token,) = children
        span = self._span(token)
        text = str(token)
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

    def _number(self, text: str, span: ast.Span) -> ast.Number:
        try:
            value = read_number(text, f"`{clip(text)}`")
        except NumberError as exc:
            self._error(span, "PAR0011", exc.message, exc.hint)
            value = 0
        return ast.Number(span=span, value=value, text=text)

    def quantity(self, meta, children):
        (token,) = children
        text = str(token)
        number_text = NUMBER_RE.match(text).group()
        unit = text[len(number_text) :].lstrip(" \t")
        unit_column = token.column + len(text) - len(unit)
        number_span = ast.Span(
            file=self.file,
            line=token.line,
            column=token.column,
            end_line=token.line,
            end_column=token.column + len(number_text),
        )
        unit_span = ast.Span(
            file=self.file,
            line=token.line,
            column=unit_column,
            end_line=token.line,
            end_column=unit_column + len(unit),
        )
        if unit not in UNITS:
            self._error(unit_span, "PAR0012", f"unknown unit `{clip(unit)}`", suggest_unit(unit))
        return ast.Quantity(
            span=self._span(token),
            number=self._number(number_text, number_span),
            unit=unit,
            unit_span=unit_span,
        )

    def string(self, meta, children):
        (token,) = children
        return ast.String(span=self._span(token), value=self._decode(token))

    def _decode(self, token: Token) -> str:
        body = str(token)[1:-1]
        out: list[str] = []
        i = 0
        while i < len(body):
            char = body[i]
            if char != "\\":
                out.append(char)
                i += 1
                continue
            escape = body[i + 1]
            column = token.column + 1 + i
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
            span = ast.Span(
                file=self.file,
                line=token.line,
                column=column,
                end_line=token.line,
                end_column=column + width,
            )
            self._error(
                span,
                "PAR0013",
                f"unknown escape `{body[i:i + width]}` in a string",
                'escapes are \\\\ \\" \\n \\t \\r and \\uXXXX (not a surrogate)',
            )
            i += 2
        return "".join(out)

    def list(self, meta, children):
        return ast.ListValue(span=self._span(meta), items=children[0] or ())

    def tuple(self, meta, children):
        return ast.TupleValue(span=self._span(meta), items=children[0] or ())

    def elements(self, meta, children):
        return tuple(children)

    def call(self, meta, children):
        name, arguments = children
        arguments = arguments or ()
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
            span=self._span(meta),
            name=self._key(name, "function name"),
            name_span=self._span(name),
            arguments=arguments,
        )

    def arguments(self, meta, children):
        return tuple(children)

    def positional(self, meta, children):
        (value,) = children
        return ast.Argument(span=value.span, name=None, name_span=None, value=value)

    def keyword(self, meta, children):
        name, value = children
        return ast.Argument(
            span=self._span(name, value.span),
            name=self._key(name, "argument name"),
            name_span=self._span(name),
            value=value,
        )
