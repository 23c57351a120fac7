"""``parc check``, ``parc fmt`` and ``parc schema``; and ``load_or_report`` for the
commands of other modules (``parc build``, ``parc plan``).

Takes: parsed command-line arguments. Gives: an exit status: 0 clean, 1 the input has
errors (or, for ``fmt --check``, would change), 2 a usage error such as a file that
cannot be read (one line on stderr, no traceback). Diagnostics go to stderr, in
colour only when stderr is a terminal (and ``NO_COLOR`` is unset). Before:
``codegen/cli/__init__.py`` calls ``register``. After: nothing.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import tempfile
from typing import Sequence, TextIO

from . import check, read_text
from .ast import strip_spans
from .diagnostics import Diagnostics, render_all
from .fmt import format_document
from .parse import parse
from .schema import schema
from .source import no_collection
from .spec import Spec

OK, ERRORS, USAGE = 0, 1, 2


def register(subparsers) -> None:
    check = subparsers.add_parser(
        "check",
        help="check specs and report every error",
        description="Parse and check each spec; print every error with file:line:col, "
        "or `FILE: ok`. Exit 0 if all are clean, 1 if any has errors, 2 if a file "
        "cannot be read. `parc check --matrix` prints which pairs of features parc build "
        "cannot generate together yet.",
    )
    check.add_argument("files", nargs="*", metavar="FILE", help=".par or .json spec")
    check.add_argument("--matrix", action="store_true",
                       help="print the features × features table of pairs parc build cannot generate yet")
    add_set_argument(check)
    check.set_defaults(func=run_check)

    fmt = subparsers.add_parser(
        "fmt",
        help="rewrite specs in canonical form",
        description="Rewrite each .par file in canonical form (in place; --stdout prints it "
        "instead). A file that does not parse is reported and left as it is.",
    )
    fmt.add_argument("files", nargs="+", metavar="FILE", help=".par spec")
    fmt.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file would change"
    )
    fmt.add_argument(
        "--diff", action="store_true", help="write nothing; print a unified diff of the changes"
    )
    fmt.add_argument(
        "--stdout", action="store_true", help="write nothing; print the canonical form of each file"
    )
    fmt.set_defaults(func=run_fmt)

    schema_parser = subparsers.add_parser(
        "schema",
        help="print the JSON Schema of a spec",
        description="Print the JSON Schema (draft 2020-12) of the normalized spec document, "
        "the form a .json spec is written in.",
    )
    schema_parser.set_defaults(func=run_schema)


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--set KEY=VALUE`` option, as ``check``, ``plan`` and ``build`` take it."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a value, e.g. --set parallel.tp=2 (repeatable; the last wins)",
    )


def _color(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and "NO_COLOR" not in os.environ


def report(exc: Diagnostics, stream: TextIO) -> None:
    stream.write(render_all(exc.errors, exc.sources, color=_color(stream)))


def _cannot_read(path: str, exc: OSError, stream: TextIO) -> None:
    reason = exc.strerror or type(exc).__name__
    stream.write(f"parc: error: cannot read {path}: {reason}\n")


def load_or_report(
    path: str, overrides: Sequence[str] = (), stream: TextIO | None = None, *, buildable: bool = True
) -> Spec | None:
    """The Spec of ``path``, or None after printing its diagnostics to ``stream``
    (default stderr); warnings are printed there too, and the Spec returned. A file
    that cannot be read is a usage error: one line ``parc: error: cannot read PATH:
    REASON`` on ``stream``, then ``SystemExit(2)``.
    ``buildable``: as ``parc.dsl.load``'s.
    """
    stream = sys.stderr if stream is None else stream
    try:
        spec, warnings = check(path, overrides, buildable=buildable)
    except Diagnostics as exc:
        report(exc, stream)
        return None
    except OSError as exc:
        _cannot_read(path, exc, stream)
        raise SystemExit(USAGE) from None
    if warnings.errors:
        report(warnings, stream)
    return spec


def run_check(args: argparse.Namespace) -> int:
    if args.matrix:
        from parc.runtime.layout.constraints import matrix_text

        print(matrix_text())
        if not args.files:
            return OK
    elif not args.files:
        sys.stderr.write("parc: error: parc check: give a spec FILE (or --matrix)\n")
        return USAGE
    status = OK
    for path in args.files:
        try:
            spec = load_or_report(path, args.overrides)
        except SystemExit:
            status = USAGE
            continue
        if spec is None:
            status = max(status, ERRORS)
        else:
            print(f"{path}: ok")
    return status


def run_fmt(args: argparse.Namespace) -> int:
    status = OK
    for path in args.files:
        if path.endswith(".json"):
            sys.stderr.write(f"parc: error: {path}: parc fmt formats .par files, not JSON\n")
            status = USAGE
            continue
        try:
            text = read_text(path)
            with no_collection():  # Note [gc while parsing]: until the tree is dropped
                formatted = _formatted(text, path)
        except OSError as exc:
            _cannot_read(path, exc, sys.stderr)
            status = USAGE
            continue
        except Diagnostics as exc:
            report(exc, sys.stderr)
            status = max(status, ERRORS)
            continue
        if args.stdout:
            sys.stdout.write(formatted)
            continue
        if formatted == text:
            continue  # already canonical: nothing to check or write
        if args.diff:
            sys.stdout.writelines(
                difflib.unified_diff(
                    text.splitlines(keepends=True),
                    formatted.splitlines(keepends=True),
                    fromfile=path,
                    tofile=f"{path} (formatted)",
                )
            )
        if args.check:
            sys.stderr.write(f"would reformat {path}\n")
            status = max(status, ERRORS)
        elif not args.diff:
            _write(path, formatted)
            sys.stderr.write(f"reformatted {path}\n")
    return status


def _formatted(text: str, path: str) -> str:
    """The canonical form of ``text``, checked to mean what ``text`` means."""
    doc = parse(text, path)
    formatted = format_document(doc)
    if formatted != text and strip_spans(parse(formatted, path)) != strip_spans(doc):
        raise RuntimeError(  # pragma: no cover - a bug
            f"internal error in parc (fmt): formatting {path} changed its meaning"
        )
    return formatted


def _write(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, keeping its permissions."""
    directory = os.path.dirname(path) or "."
    mode = os.stat(path).st_mode & 0o7777
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".parc-fmt-", suffix=".par")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def run_schema(args: argparse.Namespace) -> int:
    print(json.dumps(schema(), indent=2))
    return OK
