"""The ``parc`` command line.

Takes: argv. Gives: an exit status — 0 clean, 1 the input has errors (or a build is
stale), 2 a usage error (bad flags, missing file), 3 a hand edit that does not merge
(``parc build``), 70 an internal error (a bug in parc; sysexits' EX_SOFTWARE, so CI
never reads a crash as one of the others). Each subcommand lives in its own
module exposing ``register(subparsers)``, which adds its parser and sets
``func(args) -> int``; this file only lists them and guards against tracebacks.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from parc import __version__

INTERNAL_ERROR = 70

# Module that owns each subcommand, in the order ``parc --help`` lists them.
COMMANDS = (
    "parc.dsl.commands",  # check, fmt, schema
    "parc.codegen.cli.build",  # build
    "parc.codegen.cli.data",  # data prepare
    "parc.codegen.cli.explain",  # explain
    "parc.codegen.cli.export",  # export
    "parc.codegen.cli.import_",  # import
    "parc.codegen.cli.plan",  # plan
    "parc.codegen.cli.profile",  # profile
    "parc.codegen.cli.report",  # report
    "parc.codegen.cli.verify",  # verify
)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parc",
        description="parc compiles a .par spec into a sharded PyTorch training program.",
    )
    parser.add_argument("--version", action="version", version=f"parc {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except SystemExit as exc:  # a usage error deep in a command (e.g. an unreadable file)
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - the one place a traceback is turned into a bug report
        import traceback

        stage = getattr(args, "command", "?")
        print(
            f"parc: internal error in parc ({stage}): {type(exc).__name__}: {exc}\n"
            "This is a bug in parc, not in your spec; please report it with the trace below.",
            file=sys.stderr,
        )
        traceback.print_exc(file=sys.stderr)
        return INTERNAL_ERROR
