"""``parc build``: the command around ``codegen/build.py``.

Takes: argv (SPEC, -o DIR, --set, --check, --force, --emit). Gives: a build folder,
or a report of how an existing one differs, or one stage printed (``--emit ast|spec|plan``).
Exit status: 0 done / fresh, 1 spec errors, stale folder or refused overwrite,
2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from parc.dsl.diagnostics import Diagnostics


def register(subparsers) -> None:
    from parc.dsl.commands import add_set_argument

    parser = subparsers.add_parser(
        "build",
        help="generate the sharded training program of a spec",
        description="Generate the training program of SPEC into DIR (default build/<spec name>).",
    )
    parser.add_argument("spec", metavar="SPEC")
    parser.add_argument("-o", "--output", metavar="DIR", default=None)
    add_set_argument(parser)
    parser.add_argument("--check", action="store_true", help="exit 1 unless DIR is exactly what would be generated")
    parser.add_argument("--force", action="store_true", help="overwrite hand-edited files")
    parser.add_argument("--emit", choices=("ast", "spec", "plan"), help="print one stage and stop")
    parser.set_defaults(func=run_build)


def _say(lines):
    for line in lines:
        print(line, file=sys.stderr)


def run_build(args: argparse.Namespace) -> int:
    from parc import dsl
    from parc.dsl.commands import load_or_report, report

    from ..build import FolderError, compare, generate, recorded_files, seen_from, write
    from ..lower import lower
    from ..render import command

    if args.emit == "ast":
        try:
            text = dsl.read_text(args.spec)
        except OSError as exc:
            print(f"parc: error: cannot read {args.spec}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        try:
            print(dsl.dump(dsl.parse(text, args.spec)), end="")
        except Diagnostics as exc:
            report(exc, sys.stderr)
            return 1
        return 0
    spec = load_or_report(args.spec, args.overrides)
    if spec is None:
        return 1
    if args.emit == "spec":
        print(json.dumps(dsl.spec_document(spec), indent=2))  # a .json spec: parc check reads it
        return 0
    out_dir = Path(args.output) if args.output else Path("build") / Path(args.spec).stem
    spec = seen_from(spec, out_dir)  # the token file's path from the build folder
    try:
        plan = lower(spec)  # once: the files and the command below come from it
        if args.emit == "plan":
            print(plan, end="")
            return 0
        files = generate(spec, plan)
    except Diagnostics as exc:
        return report_stage_errors(exc, args.spec, args.overrides)
    try:
        state = compare(out_dir, files)
        previous = recorded_files(out_dir)
    except FolderError as exc:
        _say([f"parc build: error: {exc}", f"hint: {exc.hint}"])
        return 1
    if args.check:
        if state.fresh:
            print(f"{out_dir}: up to date")
            return 0
        if state.unmanaged:
            _say([f"{out_dir}: not a parc build (no {'.parc/manifest.json'})"])
        _say([f"{out_dir}: stale: {p}" for p in state.stale])
        _say([f"{out_dir}: missing: {p}" for p in state.missing])
        _say([f"{out_dir}: hand-edited: {p}" for p in state.edited])
        return 1
    if (state.edited or state.unmanaged) and not args.force:
        if state.unmanaged:
            _say([f"parc build: {out_dir} is not empty and was not made by parc; refusing to write into it"])
        for path in state.edited:
            _say([f"parc build: {out_dir / path} was edited by hand; refusing to overwrite it"])
        _say(["hint: move your changes aside, or pass --force to overwrite"])
        return 1
    try:
        write(out_dir, files, previous=previous)
    except OSError as exc:
        _say([f"parc build: error: cannot write {exc.filename or out_dir}: {exc.strerror or exc}"])
        return 1
    changed = len(state.stale) + len(state.missing) + len(state.edited)
    print(f"wrote {out_dir}/ ({len(files)} files, {changed} changed): "
          f"run `cd {out_dir} && {command(plan)}`")
    return 0


def report_stage_errors(exc, path, overrides) -> int:
    """Print diagnostics a stage after the front end raised (quoting the spec); exit 1."""
    from parc.dsl.commands import report

    if not exc.sources.texts:
        exc.sources = _sources(path, overrides)
    report(exc, sys.stderr)
    return 1


def _sources(path, overrides):
    from parc.dsl.diagnostics import SourceMap

    from parc import dsl

    sources = SourceMap()
    try:
        sources.add(path, dsl.read_text(path))
    except OSError:
        pass
    for index, text in enumerate(overrides, start=1):
        sources.add(f"--set {index}", text)
    return sources
