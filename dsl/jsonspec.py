"""A spec written as JSON (the normalized document itself) → ``Normalized``.

Takes: the text of a ``.json`` spec. Gives: the same ``Normalized`` that
``dsl/normalize.py`` makes from ``.par`` text, so validation is identical. JSON
values are already normalized: units in SI numbers, calls as ``{"kind": ...}``.

Python's ``json`` keeps no positions, so a small scanner walks the (already
decoded, hence well-formed) text alongside and records where each key and value
starts; errors then point at the key's line in the JSON text. Before: reading the
file. After: ``dsl/overrides.py``, ``dsl/validate.py``.

Note [one language, two spellings]: a JSON spec is held to what the ``.par`` front
end accepts, not to what Python's ``json`` does. So its text is refused for the
same characters (``dsl/parse.py``'s check), a byte-order mark is a blank, newlines
are unified, numbers are read by ``dsl/numbers.py`` (no ``NaN``/``Infinity``, no
``1e400`` overflowing to infinity, no 5000-digit integers), a string may not hold a
lone surrogate (a ``.par`` string cannot), nesting stops at the same depth, and a
duplicate key is an error, not "the last one wins".
"""

from __future__ import annotations

import json
import re

from .diagnostics import Diagnostics, ParcError, SourceMap, Span, clip
from .normalize import Normalized, Origin
from .numbers import MAX_DIGITS, NumberError, read_number
from .parse import bad_character_error
from .source import MAX_NESTING, LineIndex, is_surrogate, unify_newlines

_TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+)', re.S)
MAX_DEPTH = MAX_NESTING + 2
"""The document object, a block, then a value nested as deep as a ``.par`` one."""
_WORDS = ("true", "false", "null")


class _Scanner:
    """Positions of every key and value of well-formed JSON ``text``; refuses the
    numbers and strings a ``.par`` file could not hold (Note [one language, two
    spellings])."""

    def __init__(self, text: str, file: str, out: Normalized, lines: LineIndex):
        self.text, self.file, self.out, self.lines = text, file, out, lines
        self.tokens = [(m.group(1), m.start(1), m.end(1)) for m in _TOKEN.finditer(text)]
        self.index = 0

    def span(self, start: int, end: int) -> Span:
        line, column = self.lines.position(start)
        end_line, end_column = self.lines.position(max(end, start + 1))
        if end_line != line:
            end_column = column + 1
        return Span(file=self.file, line=line, column=column, end_line=line, end_column=end_column)

    def next(self):
        token = self.tokens[self.index]
        self.index += 1
        return token

    def value(self, path: tuple, key_span: Span | None, depth: int = 0) -> None:
        text, start, end = self.next()
        span = self.span(start, end if text not in "{[" else start + 1)
        self.out.origins[path] = Origin(span=span, key_span=key_span, text="")
        if text == "{":
            self._object(path)
        elif text == "[":
            self._array(path)
        elif text.startswith('"'):
            self._string(path, text, span)
        elif text not in _WORDS:
            self._number(path, text, span)

    def _object(self, path: tuple) -> None:
        seen: set[str] = set()
        while True:
            text, start, end = self.next()
            if text == "}":
                return
            if text == ",":
                continue
            key = json.loads(text)
            key_span = self.span(start, end)
            if not self._string(path + (key,), text, key_span) and key in seen:
                self.out.error(
                    path + (key, "#duplicate"),
                    key_span,
                    "PAR0105",
                    f"duplicate key {clip(text)}",
                    "remove one of them",
                )
            seen.add(key)
            self.next()  # ':'
            self.value(path + (key,), key_span)

    def _array(self, path: tuple) -> None:
        index = 0
        while True:
            if self.tokens[self.index][0] == "]":
                self.next()
                return
            if self.tokens[self.index][0] == ",":
                self.next()
                continue
            self.value(path + (index,), None)
            index += 1

    def _string(self, path: tuple, text: str, span: Span) -> bool:
        """Refuse a string holding a lone surrogate (``"\\ud800"``); True if refused."""
        if not any(is_surrogate(char) for char in json.loads(text)):
            return False
        self._refuse(
            path,
            span,
            "PAR0013",
            f"the string {clip(text)} holds a lone surrogate",
            "write the character itself; \\uD800-\\uDFFF only come in pairs",
        )
        return True

    def _number(self, path: tuple, text: str, span: Span) -> None:
        try:
            read_number(text, clip(text))
        except NumberError as exc:
            if not any(c.isdigit() for c in text):  # NaN, Infinity, -Infinity
                self._refuse(
                    path, span, "PAR0016", f"`{clip(text)}` is not a JSON number", exc.hint
                )
            else:
                self._refuse(path, span, "PAR0011", exc.message, exc.hint)

    def _refuse(self, path: tuple, span: Span, code: str, message: str, hint: str) -> None:
        self.out.error(path, span, code, message, hint)
        self.out.bad.add(path)


def _placeholder(text: str) -> float:
    """What ``json`` puts for a number the scanner will refuse (NaN, 1e400, a huge
    integer): the document is then never used, only the diagnostics."""
    return 0.0


def _int(text: str) -> int | float:
    return int(text) if len(text) <= MAX_DIGITS else _placeholder(text)


def normalize_json(text: str, file: str) -> Normalized:
    """The document in ``text``; raises ``Diagnostics`` when it is not JSON."""
    original = text
    text = unify_newlines(text)
    if text.startswith("\ufeff"):
        text = " " + text[1:]  # a byte-order mark reads as a blank, as in .par
    lines = LineIndex(text)
    sources = SourceMap()
    sources.add(file, original, lines)
    out = Normalized(start=Span(file=file, line=1, column=1, end_line=1, end_column=2))
    bad = bad_character_error(text, file, lines) or _too_deep(text, file, lines)
    if bad is not None:
        raise Diagnostics([bad], sources)
    try:
        out.doc = json.loads(text, parse_int=_int, parse_constant=_placeholder)
    except json.JSONDecodeError as exc:
        line, column = lines.position(exc.pos)
        span = Span(file=file, line=line, column=column, end_line=line, end_column=column + 1)
        raise _fail(span, f"not valid JSON: {exc.msg}", sources) from None
    except RecursionError:  # pragma: no cover - _too_deep stops it first
        raise _fail(out.start, "not valid JSON: nested too deeply", sources) from None
    try:
        _Scanner(text, file, out, lines).value((), None)
    except (IndexError, ValueError) as exc:  # pragma: no cover - the text was decoded above
        raise RuntimeError(f"internal error in parc (JSON positions): {exc!r}") from exc
    out.origins.pop((), None)
    for path, origin in out.origins.items():
        origin.text = json.dumps(_at(out.doc, path))
    return out


def _too_deep(text: str, file: str, lines: LineIndex) -> ParcError | None:
    """The ``{``/``[`` past ``MAX_DEPTH``, found before ``json`` recurses into it."""
    depth = 0
    for match in _TOKEN.finditer(text):
        token = match.group(1)
        if token in ("{", "["):
            depth += 1
            if depth > MAX_DEPTH:
                line, column = lines.position(match.start(1))
                span = Span(
                    file=file, line=line, column=column, end_line=line, end_column=column + 1
                )
                return ParcError(
                    span=span,
                    code="PAR0010",
                    message="brackets nested too deeply",
                    hint=f"values nest at most {MAX_NESTING} levels",
                )
        elif token in ("}", "]"):
            depth -= 1
    return None


def _at(doc, path: tuple):
    for part in path:
        doc = doc[part]
    return doc


def _fail(span: Span, message: str, sources: SourceMap) -> Diagnostics:
    return Diagnostics(
        [
            ParcError(
                span=span,
                code="PAR0016",
                message=message,
                hint="a JSON spec is the document `parc schema` describes",
            )
        ],
        sources,
    )
