"""What every source text is before any stage reads it: its limits and its lines.

Takes: nothing (leaf module). Gives: the limits on a source (``MAX_SOURCE_BYTES``,
``MAX_NESTING``), ``unify_newlines`` (a lone CR and CRLF become LF, so every stage
counts lines the same way), ``bad_character`` (a character no spec may hold),
``no_collection`` (Note [gc while parsing]), and ``LineIndex``: the start of every
line, built once per text, so that an offset becomes a line and column by bisection
and a line is quoted without re-splitting the text. Used by ``dsl/__init__.py`` (reading files), ``dsl/parse.py``,
``dsl/jsonspec.py``, ``dsl/overrides.py`` and ``dsl/diagnostics.py`` (quoting).

Note [newlines]: a line ends at LF, CRLF or a lone CR (old Mac files). The parser,
the JSON front end, the SourceMap and fmt all see the text after
``unify_newlines``; a CR and an LF are one character each, so line/column positions
of the unified text are those of the original. ``parc fmt`` writes LF.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import re
from itertools import accumulate

MAX_SOURCE_BYTES = 16 * 2**20
"""The largest spec file (or ``--set`` argument) parc reads: 16 MiB. A longer input
(``/dev/zero``, a log file named by mistake) is refused after reading this much + 1."""

MAX_NESTING = 32
"""Deepest nesting of (), [] in a ``.par`` value; the JSON form allows the same
depth below a block (``MAX_NESTING + 2`` levels of objects/arrays in all)."""

_BAD_CHARACTER = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f\ud800-\udfff]")
"""Control characters other than tab, LF, FF and CR; lone surrogates."""


@contextlib.contextmanager
def no_collection():
    """Note [gc while parsing]: a parse makes millions of small objects (tokens,
    spans, comments) and no cycles; the cyclic collector would walk all of them
    again and again as they pile up. It is paused for the parse, then restored.
    ``parc fmt`` and ``load_text`` keep it paused until the syntax tree is dropped:
    the first collection after it would walk the whole tree once more (1M comment
    lines: a second) to find nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def unify_newlines(text: str) -> str:
    """``text`` with CRLF and lone CR as LF (Note [newlines])."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def bad_character(text: str) -> int | None:
    """The offset of the first character no spec may hold (a control character
    other than tab, newline and form feed, or a lone surrogate), else None."""
    match = _BAD_CHARACTER.search(text)
    return match.start() if match else None


def is_surrogate(char: str) -> bool:
    return "\ud800" <= char <= "\udfff"


class LineIndex:
    """The lines of one (unified) text and where each starts."""

    built = 0
    """How many indexes were built in this process: tests check that a run builds
    a few per source, not one per diagnostic or comment."""

    __slots__ = ("lines", "_starts")

    def __init__(self, text: str):
        LineIndex.built += 1
        self.lines = unify_newlines(text).split("\n")
        self._starts: list[int] | None = None

    @property
    def starts(self) -> list[int]:
        """The offset of each line's first character (computed on first use)."""
        if self._starts is None:
            self._starts = [0, *accumulate(len(line) + 1 for line in self.lines[:-1])]
        return self._starts

    def position(self, offset: int) -> tuple[int, int]:
        """The 1-based (line, column) of ``offset``; a column counts characters."""
        line = bisect.bisect_right(self.starts, offset)
        return line, offset - self.starts[line - 1] + 1

    def line(self, number: int) -> str | None:
        """The text of line ``number`` (1-based) without its newline; ``""`` just past
        the last line (where a missing ``}`` belongs), None beyond."""
        if 1 <= number <= len(self.lines):
            return self.lines[number - 1]
        past_end = number == len(self.lines) + 1 and self.lines[-1] != ""
        return "" if past_end else None

    def last_line(self) -> int:
        """The number of the last line that holds any text (1 for an empty text)."""
        number = len(self.lines)
        while number > 1 and not self.lines[number - 1].strip():
            number -= 1
        return number
