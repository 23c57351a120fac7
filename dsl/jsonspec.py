"""A spec written as JSON (the normalized document itself) → ``Normalized``.

Takes: the text of a ``.json`` spec. Gives: the same ``Normalized`` that
``dsl/normalize.py`` makes from ``.par`` text, so validation is identical. JSON
values are already normalized: units in SI numbers, calls as ``{"kind": ...}``.

Python's ``json`` keeps no positions, so a small scanner walks the (already
decoded, hence well-formed) text alongside and records where each key and value
starts; errors then point at the key's line in the JSON text. Before: reading the
file. After: ``dsl/overrides.py``, ``dsl/validate.py``.
"""

from __future__ import annotations

import json
import re

from .diagnostics import Diagnostics, ParcError, SourceMap, Span
from .normalize import Normalized, Origin

_TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+)', re.S)
MAX_DEPTH = 64


class _Scanner:
    """Positions of every key and value of well-formed JSON ``text``."""

    def __init__(self, text: str, file: str, out: Normalized):
        self.text, self.file, self.out = text, file, out
        self.tokens = [(m.group(1), m.start(1), m.end(1)) for m in _TOKEN.finditer(text)]
        self.index = 0
        # line starts, for offset → (line, column)
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def span(self, start: int, end: int) -> Span:
        import bisect

        line = bisect.bisect_right(self.starts, start)
        column = start - self.starts[line - 1] + 1
        end_line = bisect.bisect_right(self.starts, max(end - 1, start))
        end_column = end - self.starts[end_line - 1] + 1 if end_line == line else column + 1
        return Span(file=self.file, line=line, column=column, end_line=line, end_column=end_column)

    def next(self):
        token = self.tokens[self.index]
        self.index += 1
        return token

    def value(self, path: tuple, key_span: Span | None, depth: int = 0) -> None:
        text, start, end = self.next()
        if depth > MAX_DEPTH:
            raise RecursionError
        span = self.span(start, end if text not in "{[" else start + 1)
        self.out.origins[path] = Origin(span=span, key_span=key_span, text="")
        if text == "{":
            seen: set[str] = set()
            while True:
                text, start, end = self.next()
                if text == "}":
                    return
                if text == ",":
                    continue
                key = json.loads(text)
                key_span = self.span(start, end)
                if key in seen:
                    self.out.error(
                        path + (key, "#duplicate"),
                        key_span,
                        "PAR0105",
                        f"duplicate key {text}",
                        "remove one of them",
                    )
                seen.add(key)
                self.next()  # ':'
                self.value(path + (key,), key_span, depth + 1)
        elif text == "[":
            index = 0
            while True:
                if self.tokens[self.index][0] == "]":
                    self.next()
                    return
                if self.tokens[self.index][0] == ",":
                    self.next()
                    continue
                self.value(path + (index,), None, depth + 1)
                index += 1


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def normalize_json(text: str, file: str) -> Normalized:
    """The document in ``text``; raises ``Diagnostics`` when it is not JSON."""
    out = Normalized(start=Span(file=file, line=1, column=1, end_line=1, end_column=2))
    try:
        out.doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        span = Span(
            file=file,
            line=exc.lineno,
            column=exc.colno,
            end_line=exc.lineno,
            end_column=exc.colno + 1,
        )
        raise _fail(span, f"not valid JSON: {exc.msg}", text, file) from None
    except ValueError as exc:
        raise _fail(out.start, f"not valid JSON: {exc}", text, file) from None
    except RecursionError:
        raise _fail(out.start, "not valid JSON: nested too deeply", text, file) from None
    try:
        _Scanner(text, file, out).value((), None)
    except RecursionError:
        raise _fail(out.start, "JSON nested too deeply", text, file) from None
    except (IndexError, ValueError) as exc:  # pragma: no cover - the text was decoded above
        raise RuntimeError(f"internal error in parc (JSON positions): {exc!r}") from exc
    out.origins.pop((), None)
    for path, origin in out.origins.items():
        origin.text = json.dumps(_at(out.doc, path))
    return out


def _at(doc, path: tuple):
    for part in path:
        doc = doc[part]
    return doc


def _fail(span: Span, message: str, text: str, file: str) -> Diagnostics:
    sources = SourceMap()
    sources.add(file, text)
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
