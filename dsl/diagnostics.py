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


@dataclass(frozen=True, slots=True, kw_only=True)
class ParcError:
    """One diagnostic: where, which rule (``PARxxxx``), what, and how to fix it."""

    span: Span
    code: str
    message: str
    hint: str | None = None
    severity: str = "error"

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

    def add(self, file: str, text: str) -> None:
        self.texts[file] = text

    def line(self, file: str, line: int) -> str | None:
        text = self.texts.get(file)
        if text is None:
            return None
        # Lines end at "\n" only, as the parser counts them (``splitlines`` would also
        # split at form feeds and other separators, and quote the wrong line).
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if 1 <= line <= len(lines):
            return lines[line - 1].rstrip("\r")
        return "" if line == len(lines) + 1 else None


_RED = "\x1b[1;31m"
_BOLD = "\x1b[1m"
_CYAN = "\x1b[1;36m"
_RESET = "\x1b[0m"


def render(error: ParcError, sources: SourceMap, *, color: bool = False) -> str:
    """The diagnostic as the user sees it: header, quoted line, caret, hint."""

    def paint(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if color else text

    span = error.span
    header = (
        f"{paint(str(span) + ':', _BOLD)} "
        f"{paint(f'{error.severity}[{error.code}]:', _RED)} {error.message}"
    )
    out = [header]
    source_line = sources.line(span.file, span.line)
    if source_line is not None:
        # Tabs count as one column, as the parser counts them; control characters
        # are shown as "?" so a quoted line cannot drive the terminal.
        source_line = "".join(
            " " if c == "\t" else c if c.isprintable() else "?" for c in source_line
        )
        gutter = str(span.line)
        pad = " " * len(gutter)
        start = max(span.column, 1)
        if span.end_line == span.line and span.end_column > start:
            width = span.end_column - start
        else:
            width = max(len(source_line) - start + 1, 1)
        width = max(1, min(width, max(len(source_line) - start + 1, 1)))
        caret = " " * (start - 1) + ("^" if width == 1 else "^" * width)
        out.append(f"  {gutter} | {source_line}".rstrip())
        out.append(f"  {pad} | {paint(caret, _RED)}")
    if error.hint:
        out.append(f"  {paint('hint:', _CYAN)} {error.hint}")
    return "\n".join(out)


def render_all(errors, sources: SourceMap, *, color: bool = False) -> str:
    """Every diagnostic, blank-line separated, then a one-line count."""
    errors = tuple(errors)
    parts = [render(e, sources, color=color) for e in errors]
    count = len(errors)
    parts.append(f"{count} error{'s' if count != 1 else ''}")
    return "\n\n".join(parts[:-1]) + ("\n\n" if parts[:-1] else "") + parts[-1] + "\n"


def did_you_mean(word: str, choices) -> str | None:
    """The closest of ``choices`` to ``word``, for "did you mean" hints, or None."""
    import difflib

    matches = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None
