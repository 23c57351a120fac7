"""``parc verify``: prove a layout trains like one rank, on this machine.

Takes: argv (SPEC or a build folder DIR, --set, --steps, --junit FILE, --spec, --keep,
--timeout, --max-ranks). Gives: a report on stdout — the layout, the shrink as the
``--set`` overrides it is, each step's loss from one rank and from the layout, the
worst relative difference and the verdict — and, with ``--junit``, a JUnit XML file.
Exit status: 0 the layout matches one rank, 1 it does not (or the spec has errors, or a
trainer failed), 2 a usage error. The work is ``codegen/verify.py`` (a spec) and
``codegen/verify_dir.py`` (a build folder, hand edits included).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from parc.dsl.diagnostics import Diagnostics


def register(subparsers) -> None:
    from parc.dsl.commands import add_set_argument

    from ..verify import MAX_RANKS, RTOL, STEPS

    parser = subparsers.add_parser(
        "verify",
        help="prove a layout trains exactly like one rank (shrunk, on CPU)",
        description=(
            "Shrink the model of SPEC (or of the build folder DIR, with its hand edits) to a tiny one "
            "with the same layout, run it with torchrun on CPU gloo and as one rank, and compare every "
            f"step's loss and the first gradient norm within {RTOL:g} relative. Exit 0 pass, 1 fail."
        ),
    )
    parser.add_argument("target", metavar="SPEC|DIR")
    add_set_argument(parser)
    parser.add_argument("--steps", type=int, default=STEPS, metavar="N", help=f"steps to compare (default {STEPS})")
    parser.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE")
    parser.add_argument("--spec", metavar="SPEC", help="DIR only: the spec it was built from "
                        "(default: the spec its manifest names, next to DIR or in the cwd)")
    parser.add_argument("--keep", metavar="WORKDIR", help="build and run in WORKDIR and keep it (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=600, metavar="S", help="seconds each trainer may run (default 600)")
    parser.add_argument("--max-ranks", type=int, default=MAX_RANKS, metavar="N",
                        help=f"refuse layouts of more ranks (default {MAX_RANKS})")
    parser.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from parc.dsl.commands import report
    from parc.runtime.paths import UnwritablePath, check_target

    from ..verify import VerifyError
    from .build import report_stage_errors

    if args.steps < 1:
        print("parc verify: error: --steps must be at least 1", file=sys.stderr)
        return 2
    target = Path(args.target)
    if not target.exists():
        print(f"parc: error: cannot read {args.target}: No such file or directory", file=sys.stderr)
        return 2
    if args.junit:
        try:
            check_target(args.junit, folder=False)
        except UnwritablePath as exc:
            print(f"parc verify: error: --junit {args.junit}: {exc}", file=sys.stderr)
            return 2
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="parc-verify-"))
    try:
        verdict = _verify(target, args, workdir)
    except Diagnostics as exc:
        if exc.sources.texts:
            report(exc, sys.stderr)
            return 1
        return report_stage_errors(exc, args.spec or args.target, args.overrides)
    except VerifyError as exc:
        print(f"parc verify: error: {exc}", file=sys.stderr)
        if exc.detail:
            print(_indent(exc.detail), file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        if args.junit:  # CI still gets a report: one test case, in error
            from ..verify import junit_error

            _write_atomically(Path(args.junit), junit_error(args.target, str(exc), exc.detail))
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report_text(verdict, args.target), end="")
    if args.junit:
        from ..verify import junit_xml

        _write_atomically(Path(args.junit), junit_xml(verdict, args.target))
    return 0 if verdict.passed else 1


def _verify(target: Path, args, workdir: Path):
    from ..verify import verify_spec

    if target.is_dir():
        from ..verify_dir import verify_folder

        return verify_folder(target, args.spec, args.overrides, workdir, steps=args.steps,
                             timeout=args.timeout, max_ranks=args.max_ranks)
    if args.spec:
        raise SystemExit(_usage("--spec is for a build folder; SPEC is the spec already"))
    return verify_spec(str(target), args.overrides, workdir, steps=args.steps, timeout=args.timeout,
                       max_ranks=args.max_ranks)


def _usage(message: str) -> int:
    print(f"parc verify: error: {message}", file=sys.stderr)
    return 2


def _indent(text: str) -> str:
    return "\n".join(f"  | {line}" for line in text.splitlines())


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.parc-tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def report_text(verdict, target: str) -> str:
    """The report: layout, shrink, steps, worst difference, verdict."""
    from ..verify import RTOL, failure_text

    lines = [f"parc verify {target}", f"layout: {verdict.layout} ({verdict.world} rank{'s' if verdict.world != 1 else ''}, CPU gloo)"]
    lines += list(verdict.notes)
    lines.append("shrunk, as --set over the spec:")
    width = max((len(c.key) for c in verdict.shrink.changes), default=0)
    for change in verdict.shrink.changes:
        lines.append(f"  {change.key:<{width}}  {_clip(change.before)} → {_clip(change.after)}  ({change.why})")
    lines.append("one-rank reference: the same, --set " + " ".join(verdict.reference_overrides))
    if verdict.command:
        lines.append(f"the shrunk layout by hand: {verdict.command}")
    lines.append(f"{'step':>4}  {'value':<9}  {'one rank':>16}  {'layout':>16}  {'rel. diff':>9}")
    for record in verdict.records:
        got = "missing" if record.layout is None else f"{record.layout:.9g}"
        mark = "" if record.ok else "  <- differs"
        lines.append(f"{record.step:>4}  {record.name:<9}  {record.reference:>16.9g}  {got:>16}  "
                     f"{record.difference:>9.2g}{mark}")
    worst = verdict.worst
    if worst is not None:
        lines.append(f"worst relative difference: {worst.difference:.3g} (step {worst.step} {worst.name}); "
                     f"allowed {RTOL:g}")
    failure = verdict.first_failure
    if verdict.passed:
        lines.append(f"PASS: {verdict.layout} trains like one rank ({len(verdict.records)} values, "
                     f"{verdict.seconds:.1f} s)")
    else:
        lines.append(f"FAIL: {failure_text(failure)}" if failure else "FAIL: nothing was compared")
    return "\n".join(lines) + "\n"


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 5] + " ...]"
