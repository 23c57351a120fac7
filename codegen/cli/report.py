"""``parc report``: draw a run's metrics as PNGs.

Takes: argv (RUN.jsonl, -o DIR). Gives: DIR/loss.png, tokens_per_s.png,
exposed_comm.png and memory_per_rank.png (``codegen/run_report.py``), the planner's
prediction drawn as a line where the build recorded one. Exit status: 0 written, 1 the
file cannot be read as a metrics file, 2 usage error (or matplotlib missing).
Before: a trainer run with ``--metrics-jsonl RUN.jsonl``. After: nothing.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="draw a run's --metrics-jsonl file as PNGs (loss, tokens/s, communication, memory)",
        description="Read the JSON lines a trainer wrote with --metrics-jsonl and draw loss, "
        "tokens/s, exposed communication and memory per rank as PNGs, with the planner's "
        "prediction as a line where the build recorded one. Needs matplotlib.",
    )
    parser.add_argument("run", metavar="RUN.jsonl", help="the trainer's --metrics-jsonl file")
    parser.add_argument("-o", "--output", metavar="DIR", required=True, help="folder of the PNGs")
    parser.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from parc.runtime.paths import UnwritablePath, check_target

    from ..run_report import ReportError, draw, read_records

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("parc report: needs matplotlib, which is not installed: pip install matplotlib", file=sys.stderr)
        return 2
    try:
        check_target(args.output, folder=True)
    except UnwritablePath as exc:
        print(f"parc report: -o {exc}", file=sys.stderr)
        return 2
    try:
        records = read_records(args.run)
    except ReportError as exc:
        print(f"parc report: {exc}", file=sys.stderr)
        return 1
    for path in draw(records, args.output, title=args.run.rsplit("/", 1)[-1]):
        print(f"wrote {path}")
    return 0
