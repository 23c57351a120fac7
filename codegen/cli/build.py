"""``parc build``: the command around ``codegen/build.py`` and ``codegen/build_merge.py``.

Takes: argv (SPEC, -o DIR, --set, --check, --diff, --force, --write-conflicts,
--accept, --emit). Gives: a build folder with the user's edits merged in, or a report
of how an existing one differs, or one stage printed (``--emit ast|spec|plan``).
Exit status: 0 done / fresh (edits that merge allowed); 1 spec errors, a stale folder
(``--check``), a folder parc must not touch; 2 usage error (a missing folder to
check); 3 an edit does not merge with the new generation (nothing written, or
``--write-conflicts`` wrote markers).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from parc.dsl.diagnostics import Diagnostics

CONFLICT = 3
RESOLUTIONS = ("force", "write_conflicts", "accept")


def register(subparsers) -> None:
    from parc.dsl.commands import add_set_argument

    parser = subparsers.add_parser(
        "build",
        help="generate the sharded training program of a spec",
        description="Generate the training program of SPEC into DIR (default build/<spec name>). "
        "Edits you made to the files of DIR are merged into the new generation (3-way, "
        "against the text parc generated last, kept in DIR/.parc/).",
    )
    parser.add_argument("spec", metavar="SPEC")
    parser.add_argument("-o", "--output", metavar="DIR", default=None)
    add_set_argument(parser)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 0 if DIR is what parc would generate (edits that merge "
                        "allowed), 1 if it is stale, 2 if it is not a build, 3 if an edit does not merge")
    parser.add_argument("--diff", action="store_true",
                        help="write nothing; print unified diffs (yours against the last generation, and "
                        "on disk against what would be written); exit status as --check")
    parser.add_argument("--force", action="store_true",
                        help="replace edits that do not merge with the new generation, saving yours as FILE.orig")
    parser.add_argument("--write-conflicts", action="store_true",
                        help="write edits that do not merge with git-style conflict markers (exit 3)")
    parser.add_argument("--accept", action="store_true",
                        help="keep edited files that do not merge as they are, recorded against the new generation")
    parser.add_argument("--emit", choices=("ast", "spec", "plan"), help="print one stage and stop")
    parser.set_defaults(func=run_build)


def _say(lines):
    for line in lines:
        print(line, file=sys.stderr)


def _usage(args) -> str | None:
    """Flags that cannot go together, as one message."""
    chosen = [f"--{name.replace('_', '-')}" for name in RESOLUTIONS if getattr(args, name)]
    if len(chosen) > 1:
        return f"{' and '.join(chosen)} cannot go together: pick one way to resolve edits that do not merge"
    if chosen and (args.check or args.diff):
        return f"{'--check' if args.check else '--diff'} writes nothing; it cannot go with {chosen[0]}"
    return None


def run_build(args: argparse.Namespace) -> int:
    from parc import dsl
    from parc.dsl.commands import load_or_report, report

    from ..build import generate, seen_from
    from ..lower import lower
    from ..passes import choose_layout

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
    if problem := _usage(args):
        _say([f"parc build: error: {problem}"])
        return 2
    out_dir = Path(args.output) if args.output else Path("build") / Path(args.spec).stem
    if (args.check or args.diff) and not args.overrides:  # Note [the build records its --set]
        args.overrides = recorded_sets(out_dir)
    spec = load_or_report(args.spec, args.overrides)
    if spec is None:
        return 1
    if args.emit == "spec":
        print(json.dumps(dsl.spec_document(spec), indent=2))  # a .json spec: parc check reads it
        return 0
    spec = seen_from(spec, out_dir)  # the token file's path from the build folder (build.load_built)
    try:
        plan = lower(spec)  # once: the files and the command below come from it
        if args.emit == "plan":
            print(plan, end="")
            return 0
        files = generate(spec, plan, tuple(args.overrides))
    except Diagnostics as exc:
        return report_stage_errors(exc, args.spec, args.overrides)
    if warnings := choose_layout.memory_warnings(spec):  # PAR0808: built anyway, as written
        report(Diagnostics(warnings, _sources(args.spec, args.overrides)), sys.stderr)
    return build_folder(args, plan, files, out_dir)


def recorded_sets(out_dir: Path) -> list[str]:
    """The ``--set`` values the folder's manifest records (none when it has no readable
    manifest: ``--check`` then says what is wrong with it)."""
    from ..build_folder import FolderError, read_record

    try:
        record = read_record(out_dir) if out_dir.is_dir() else None
    except FolderError:
        return []
    return [] if record is None else list(record.sets)


def _command(args, out_dir: Path) -> str:
    words = ["parc", "build", args.spec, "-o", str(out_dir)]
    for override in args.overrides:
        words += ["--set", override]
    return shlex.join(words)


def build_folder(args, plan, files, out_dir: Path) -> int:
    """Check, diff or write ``out_dir``; the exit status."""
    from ..build_folder import FolderError
    from ..build_merge import plan_rebuild

    checking = args.check or args.diff
    if checking and not out_dir.is_dir():
        what = "not a folder" if out_dir.exists() else "no such folder"
        _say([f"parc build: error: {out_dir}: {what}, nothing to check",
              f"hint: build it first: {_command(args, out_dir)}"])
        return 2
    try:
        rebuild = plan_rebuild(out_dir, files)
        if checking:
            return check(args, out_dir, rebuild)
        return rebuild_folder(args, plan, out_dir, rebuild)
    except FolderError as exc:
        _say([f"parc build: error: {exc}", f"hint: {exc.hint}"])
        return 1
    except OSError as exc:
        _say([f"parc build: error: cannot write {exc.filename or out_dir}: {exc.strerror or exc}"])
        return 1


def check(args, out_dir: Path, rebuild) -> int:
    """``--check`` and ``--diff``: write nothing, say how the folder differs."""
    from ..build_folder import read_record
    from .build_report import check_lines, diff_text, resolve_hint

    if read_record(out_dir) is None:
        _say([f"parc build: error: {out_dir} is not a parc build (it has no .parc/manifest.json)",
              f"hint: build it: {_command(args, out_dir)}"])
        return 2
    if args.diff:
        print(diff_text(out_dir, rebuild), end="")
    status = rebuild.check_status()
    lines = check_lines(out_dir, rebuild)
    if status == 0:
        print(f"{out_dir}: up to date")
        for line in lines:
            print(line)
        return 0
    _say(lines)
    if status == CONFLICT:
        _say([resolve_hint(_command(args, out_dir), rebuild)])
    else:
        _say([f"hint: rebuild it: {_command(args, out_dir)}"])
    return status


def rebuild_folder(args, plan, out_dir: Path, rebuild) -> int:
    """Merge and write; stop with exit 3 (nothing written) on edits that do not merge."""
    from ..build_merge import BY_HAND, Resolve, apply
    from ..render import command
    from .build_report import conflict_lines, plural, resolve_hint, summary_line

    chosen = {"force": Resolve.FORCE, "write_conflicts": Resolve.MARKERS, "accept": Resolve.ACCEPT}
    resolve = next((chosen[name] for name in RESOLUTIONS if getattr(args, name)), Resolve.NOTHING)
    if rebuild.unmanaged and resolve != Resolve.FORCE:
        _say([f"parc build: {out_dir} is not empty and was not made by parc; refusing to write into it",
              "hint: build into a new folder, or pass --force (files of yours that parc would replace are saved as FILE.orig)"])
        return 1
    # Plain: every file that does not merge stops the build. Markers left from an earlier
    # --write-conflicts stop it too (only --force, which backs them up, goes past them).
    if resolve == Resolve.NOTHING:
        stop = rebuild.blocked
    else:
        stop = rebuild.of(*BY_HAND) if resolve != Resolve.FORCE else ()
    if stop:
        for outcome in stop:
            _say(conflict_lines(out_dir, outcome))
        _say([f"parc build: nothing was written ({plural(len(stop), 'file')} of yours "
              f"{'does' if len(stop) == 1 else 'do'} not merge with the new generation)",
              resolve_hint(_command(args, out_dir), rebuild)])
        return CONFLICT
    applied = apply(out_dir, rebuild, resolve)
    for outcome in rebuild.outcomes:
        if line := summary_line(out_dir, outcome, resolve == Resolve.ACCEPT):
            print(line)
    for path, backup in applied.backups:
        print(f"{out_dir}: saved your {path} as {backup}, then wrote the new generation")
    print(f"wrote {out_dir}/ ({len(rebuild.files)} files, {len(applied.written)} changed): "
          f"run `cd {out_dir} && {command(plan)}`")
    if applied.markers:
        _say([f"{out_dir / path}: wrote conflict markers" for path in applied.markers])
        _say([f"hint: resolve the <<<<<<< ... >>>>>>> markers, then `{_command(args, out_dir)} --check` exits 0"])
        return CONFLICT
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
