"""Source positions and user-facing errors.

Takes: nothing (leaf module). Gives: ``Span`` (where a piece of spec text is),
``ParcError`` (one diagnostic), ``Diagnostics`` (the exception that carries every
diagnostic of a run, sorted by position) and ``render`` (the text a user sees).
Every stage of parc reports problems in the user's input through these types; an
internal failure is a bug and says "internal error in parc".

Rendered form (STYLE.md rule 2)::

    examples/gpt.par:12:9: error[PAR0203]: tp = 3 does not divide heads = 16
       12 |   tp = 3
          |        ^
      hint: tp must be one of 1, 2, 4, 8, 16
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .source import LineIndex


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """A range of source text. Lines and columns are 1-based; the end is exclusive."""

    file: str
    """The file as the user named it (or ``--set N`` for a command-line override)."""
    line: int
    column: int
    end_line: int
    end_column: int
    planned: bool = False
    """The value here was ``auto`` and the planner chose it (``codegen/passes/choose_layout.py``
    gives the chosen values the span of their ``auto``; generated code cites them so)."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"

    @classmethod
    def at(cls, file: str, line: int, column: int, end_line: int, end_column: int) -> "Span":
        """``Span(file=file, line=line, column=column, end_line=..., end_column=...)``,
        made quickly (Note [fast spans])."""
        span = _new(cls)
        _set_file(span, file)
        _set_line(span, line)
        _set_column(span, column)
        _set_end_line(span, end_line)
        _set_end_column(span, end_column)
        _set_planned(span, False)
        return span

    @classmethod
    def on_line(cls, file: str, line: int, column: int, end_column: int) -> "Span":
        """``Span.at`` for a span within one line."""
        return cls.at(file, line, column, line, end_column)


# Note [fast spans]: a frozen dataclass's __init__ sets each field through
# object.__setattr__, about 2.7 us for a Span; a file of a million comments makes a
# million spans. ``Span.at`` fills the slots directly (0.6 us) and gives an
# equal, equally frozen Span (tests/dsl/test_hardening.py checks that it does).
_new = object.__new__
_set_file = Span.file.__set__
_set_line = Span.line.__set__
_set_column = Span.column.__set__
_set_end_line = Span.end_line.__set__
_set_end_column = Span.end_column.__set__
_set_planned = Span.planned.__set__


class Severity(str, Enum):
    """How bad a diagnostic is: an ``error`` stops the command (exit 1); a ``warning``
    is printed and the command goes on (Note [warnings])."""

    ERROR = "error"
    WARNING = "warning"


# Note [warnings]: a warning says something is probably wrong that parc cannot know
# for sure from the spec alone, such as a token file whose recorded vocabulary is larger
# than the model's (the file may be rewritten before the run; the trainer checks the
# ids themselves). ``parc.dsl.check`` returns warnings beside the Spec; ``parc check``,
# ``plan`` and ``build`` print them as ``warning[PARxxxx]`` and still exit 0.


@dataclass(frozen=True, slots=True, kw_only=True)
class ParcError:
    """One diagnostic: where, which rule (``PARxxxx``), what, and how to fix it."""

    span: Span
    code: str
    message: str
    hint: str | None = None
    severity: Severity = Severity.ERROR

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def sort_key(self) -> tuple:
        return (self.span.file, self.span.line, self.span.column, self.code, self.message)


class Diagnostics(Exception):
    """Raised by a stage that found problems in user input; carries all of them."""

    def __init__(
        self,
        errors: list[ParcError] | tuple[ParcError, ...],
        sources: "SourceMap | None" = None,
    ):
        self.errors: tuple[ParcError, ...] = tuple(sorted(errors, key=ParcError.sort_key))
        self.sources: SourceMap = sources if sources is not None else SourceMap()
        """The texts the errors point into, so ``render`` can quote them."""
        super().__init__("\n".join(f"{e.span}: {e.message}" for e in self.errors))


@dataclass(slots=True)
class SourceMap:
    """The text of every source a run has read, so diagnostics can quote it."""

    texts: dict[str, str] = field(default_factory=dict)
    _indexes: dict[str, LineIndex] = field(default_factory=dict)

    def add(self, file: str, text: str, index: LineIndex | None = None) -> None:
        """Record ``text``; its line index is built when a line is first quoted
        (or is ``index``, when the caller has built it already)."""
        self.texts[file] = text
        self._indexes.pop(file, None)
        if index is not None:
            self._indexes[file] = index

    def index(self, file: str) -> LineIndex | None:
        """The line index of ``file`` (Note [newlines] in ``dsl/source.py``)."""
        if file not in self._indexes:
            text = self.texts.get(file)
            if text is None:
                return None
            self._indexes[file] = LineIndex(text)
        return self._indexes[file]

    def line(self, file: str, line: int) -> str | None:
        # Lines end at LF, CRLF or CR only, as the parser counts them (``splitlines``
        # would also split at form feeds and other separators, and quote the wrong line).
        index = self.index(file)
        return None if index is None else index.line(line)


_RED = "\x1b[1;31m"
_YELLOW = "\x1b[1;33m"
_BOLD = "\x1b[1m"
_CYAN = "\x1b[1;36m"
_RESET = "\x1b[0m"


QUOTE_MARGIN = 80
"""A quoted line longer than the caret ± this many columns is clipped around the
caret, with ``…`` where text was cut, so a 1 MB line prints a screenful."""
MESSAGE_LIMIT = 400
"""A message or hint longer than this (it echoes a huge word) is cut, with ``…``."""


def clip(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters with ``…``: user words in messages."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _printable(text: str) -> str:
    """Tabs as one blank (the parser counts them as one column), other characters
    that could drive the terminal as ``?``."""
    if text.isprintable():
        return text
    return "".join(" " if c == "\t" else c if c.isprintable() else "?" for c in text)


def _quote(source_line: str, start: int, width: int) -> tuple[str, int, int]:
    """The part of ``source_line`` to show, and the caret's column and width in it."""
    end = start + width  # exclusive, 1-based
    first = max(1, start - QUOTE_MARGIN)
    last = min(len(source_line), end - 1 + QUOTE_MARGIN, start + 2 * QUOTE_MARGIN)  # inclusive
    if first == 1 and last == len(source_line):
        return source_line, start, width
    shown = source_line[first - 1 : last]
    end = min(end, last + 1)
    prefix = "…" if first > 1 else ""
    suffix = "…" if last < len(source_line) else ""
    return prefix + shown + suffix, start - first + 1 + len(prefix), max(1, end - start)


def render(error: ParcError, sources: SourceMap, *, color: bool = False) -> str:
    """The diagnostic as the user sees it: header, quoted line, caret, hint."""

    def paint(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if color else text

    span = error.span
    message = _printable(clip(error.message, MESSAGE_LIMIT))
    header = (
        f"{paint(str(span) + ':', _BOLD)} "
        f"{paint(f'{error.severity.value}[{error.code}]:', _RED if error.is_error else _YELLOW)} {message}"
    )
    out = [header]
    source_line = sources.line(span.file, span.line)
    if source_line is not None:
        gutter = str(span.line)
        pad = " " * len(gutter)
        start = max(span.column, 1)
        if span.end_line == span.line and span.end_column > start:
            width = span.end_column - start
        else:
            width = max(len(source_line) - start + 1, 1)
        width = max(1, min(width, max(len(source_line) - start + 1, 1)))
        shown, start, width = _quote(source_line, start, width)
        caret = " " * (start - 1) + ("^" if width == 1 else "^" * width)
        out.append(f"  {gutter} | {_printable(shown)}".rstrip())
        out.append(f"  {pad} | {paint(caret, _RED if error.is_error else _YELLOW)}")
    if error.hint:
        out.append(f"  {paint('hint:', _CYAN)} {_printable(clip(error.hint, MESSAGE_LIMIT))}")
    return "\n".join(out)


ERROR_LIMIT = 100
"""``render_all`` prints at most this many diagnostics (Note [error limit])."""
DUPLICATES_SHOWN = 10
"""Duplicates of one key shown one by one; the rest are one error (normalize.py), and the
quick parser does not build their entries when it only checks (Note [duplicates counted])."""

# Note [error limit]: a spec with thousands of errors is nearly always one mistake
# repeated (a pasted block, a generated file), and a terminal shows a screenful. As
# clang does (``-ferror-limit``, 20 by default), ``render_all`` prints the first
# ERROR_LIMIT diagnostics by position, then one line saying how many it left out; the
# count line below it still counts them all, and the exit status is unchanged. It
# also keeps ``parc check`` of 100k errors from spending seconds on text nobody reads.


def render_all(errors, sources: SourceMap, *, color: bool = False, limit: int | None = ERROR_LIMIT) -> str:
    """The diagnostics, blank-line separated (the first ``limit`` of them; None: all),
    then a one-line count of all of them (``2 errors``, ``1 error, 1 warning``,
    ``1 warning``)."""
    errors = tuple(errors)
    count = len(errors)
    shown = errors if limit is None else errors[:limit]
    parts = [render(e, sources, color=color) for e in shown]
    warnings = sum(not e.is_error for e in errors)
    footer = _count(count - warnings, "error")
    if warnings:
        footer = _count(warnings, "warning") if warnings == count else f"{footer}, {_count(warnings, 'warning')}"
    if len(shown) < count:
        more = count - len(shown)
        word = "diagnostic" if warnings else "error"
        footer = (
            f"… and {more:,} more {word}{'s' if more != 1 else ''} not shown "
            f"(parc prints the first {len(shown)})\n{footer}"
        )
    return "\n\n".join(parts) + ("\n\n" if parts else "") + footer + "\n"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def did_you_mean(word: str, choices) -> str | None:
    """The closest of ``choices`` to ``word``, for "did you mean" hints, or None.

    By meaning first: a choice that refines the word (``h100`` → ``h100-80gb``), that
    the word refines (``h200-141gb`` → ``h200``), or that is the word spelled without
    its separators (``rtx-3090``, ``3090`` → ``rtx3090``); when several are (``a100``:
    the 40 and 80 GB parts) there is no one guess, and the caller lists the choices.
    Only then by spelling (difflib), which would take ``h100`` for ``h200``."""
    import difflib

    choices = sorted(choices)
    related = [c for c in choices if _related(word, c)]
    if related:
        return related[0] if len(related) == 1 else None
    matches = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return matches[0] if matches else None


def _related(word: str, choice: str) -> bool:
    if choice.startswith(word + "-") or word.startswith(choice + "-"):
        return True
    bare_word, bare_choice = word.replace("-", "").replace("_", ""), choice.replace("-", "").replace("_", "")
    return bare_word.isalnum() and len(bare_word) >= 3 and bare_choice.endswith(bare_word)
