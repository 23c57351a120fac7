"""A spec file's bytes → its text, within the size limit.

Takes: a path (or bytes already read). Gives: ``read_text``, the one place parc
reads a spec file (``parc check``, ``fmt``, ``plan``, ``build`` all come here),
``decode`` and ``too_long``, the diagnostic for an input over
``MAX_SOURCE_BYTES`` (a file here, a ``--set`` argument in ``dsl/overrides.py``).
Before: the command line. After: ``dsl/parse.py`` or ``dsl/jsonspec.py``.
"""

from __future__ import annotations

from .diagnostics import Diagnostics, ParcError, SourceMap, Span
from .source import MAX_SOURCE_BYTES, LineIndex, unify_newlines


def read_text(path: str) -> str:
    """The text of the file at ``path``: every spec file parc reads comes through
    here. Raises ``OSError`` (``FileNotFoundError``, ...) if it cannot be read, and
    ``Diagnostics`` if it is longer than ``MAX_SOURCE_BYTES`` (PAR0018; at most that
    many bytes + 1 are read, so ``/dev/zero`` stops at once) or not UTF-8 (PAR0001)."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise Diagnostics([too_long(path, "the file")])
    return decode(data, path)


def too_long(file: str, what: str) -> ParcError:
    """PAR0018: ``what`` (the file, a ``--set`` argument) is over the size limit."""
    return ParcError(
        span=Span(file=file, line=1, column=1, end_line=1, end_column=2),
        code="PAR0018",
        message=f"{what} is larger than {MAX_SOURCE_BYTES // 2**20} MiB; parc reads specs "
        "up to that size",
        hint="is this the spec? a spec is a few hundred lines of text",
    )


def decode(data: bytes, file: str) -> str:
    """``data`` as UTF-8 text; ``Diagnostics`` (PAR0001) at the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        shown = data.decode("utf-8", errors="replace")
        before = data[: exc.start].decode("utf-8", errors="replace")
        index = LineIndex(shown)
        line, column = index.position(len(unify_newlines(before)))
        sources = SourceMap()
        sources.add(file, shown, index)
        span = Span(file=file, line=line, column=column, end_line=line, end_column=column + 1)
        error = ParcError(
            span=span,
            code="PAR0001",
            message=f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x})",
            hint="save the spec as UTF-8",
        )
        raise Diagnostics([error], sources) from None
