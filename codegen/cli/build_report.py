"""The words ``parc build`` says about a folder: check lines, merge summaries, conflicts, diffs.

Takes: a ``Rebuild`` (``codegen/build_merge.py``) and the folder's name. Gives: lines
of text, deterministic (files in path order, no timestamps). Before: ``plan_rebuild``.
After: ``codegen/cli/build.py`` prints them and picks the exit status.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from ..build_merge import BASE_MARK, END, MIDDLE, START, FileMerge, Hunk, Kind, Rebuild

SHOWN_HUNKS = 5
"""Conflicting hunks shown per file before "and N more" (``--diff`` shows all)."""
SHOWN_LINES = 20
"""Lines shown per side of a hunk."""


def plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count} {word if count == 1 else words or word + 's'}"


def _first_line(outcome: FileMerge) -> str:
    hunks = outcome.merge.hunks if outcome.merge else ()
    if not hunks:
        return ""
    return f"{plural(len(hunks), 'hunk')}, the first at line {hunks[0].yours_line}"


def check_line(out_dir: Path, outcome: FileMerge) -> str:
    """One line of ``--check`` for a file that is not simply up to date."""
    path, kind = outcome.path, outcome.kind
    said = {
        Kind.STALE: f"stale: {path}",
        Kind.MISSING: f"missing: {path}",
        Kind.KEPT: f"edited, merges cleanly: {path}",
        Kind.MERGED: f"stale: {path} (edited; your edits merge cleanly)",
        Kind.CONFLICT: f"edited, conflicts with the new generation: {path} ({_first_line(outcome)})",
        Kind.NO_BASE: f"edited, no base to merge against: {path} ({outcome.reason})",
        Kind.MARKERS: f"unresolved conflict markers: {path} ({outcome.reason})",
        Kind.UNPARSED: f"edited, no longer parses: {path} ({outcome.reason})",
        Kind.DROPPED: f"stale: {path} (no longer generated)",
        Kind.DROPPED_EDITED: f"stale: {path} (no longer generated; edited, so a rebuild leaves it to you)",
    }[kind]
    return f"{out_dir}: {said}"


def check_lines(out_dir: Path, rebuild: Rebuild) -> list[str]:
    return [check_line(out_dir, outcome) for outcome in rebuild.outcomes if outcome.kind != Kind.FRESH]


def resolve_hint(command: str, rebuild: Rebuild) -> str:
    """What to do when files do not merge."""
    if rebuild.of(Kind.MARKERS):
        return f"hint: resolve the <<<<<<< ... >>>>>>> markers by hand, then run `{command}` again"
    if rebuild.of(Kind.UNPARSED):
        return (f"hint: fix the file by hand (or run `{command}` with --force: yours saved as "
                f"{rebuild.of(Kind.UNPARSED)[0].path}.orig, then replaced)")
    example = rebuild.blocked[0].path
    return (
        f"hint: edit your files so they merge, or run `{command}` with --write-conflicts "
        f"(git-style markers to resolve), --force (yours saved as {example}.orig, then replaced) "
        f"or --accept (yours kept as it is); --diff shows the differences"
    )


def _text(line: bytes) -> str:
    return line.decode("utf-8", errors="replace").rstrip("\r\n")


def _side(marker: bytes, lines: tuple[bytes, ...]) -> list[str]:
    shown = [_text(marker), *(_text(line) for line in lines[:SHOWN_LINES])]
    if len(lines) > SHOWN_LINES:
        shown.append(f"... ({plural(len(lines) - SHOWN_LINES, 'more line')})")
    return shown


def hunk_lines(out_dir: Path, path: str, hunk: Hunk) -> list[str]:
    """One conflict as git-style markers, under the place it starts."""
    lines = [f"{out_dir / path}:{hunk.yours_line}: (new generation: line {hunk.new_line})"]
    lines += _side(START, hunk.yours)
    if hunk.base is not None:
        lines += _side(BASE_MARK, hunk.base)
    lines += _side(MIDDLE, hunk.new)
    return [*lines, _text(END)]


def conflict_lines(out_dir: Path, outcome: FileMerge) -> list[str]:
    """What ``parc build`` says about a file that does not merge."""
    where = out_dir / outcome.path
    if outcome.kind == Kind.MARKERS:
        return [f"parc build: {where} still holds conflict markers ({outcome.reason}); resolve them first"]
    if outcome.kind == Kind.UNPARSED:
        return [f"parc build: {where} no longer parses as Python ({outcome.reason}); fix it first"]
    hunks = outcome.merge.hunks
    if outcome.kind == Kind.NO_BASE:
        head = f"parc build: {where} differs from the new generation and cannot be merged: {outcome.reason}"
    else:
        head = f"parc build: {where}: your edits conflict with the new generation ({plural(len(hunks), 'hunk')})"
    lines = [head]
    for hunk in hunks[:SHOWN_HUNKS]:
        lines += hunk_lines(out_dir, outcome.path, hunk)
    if len(hunks) > SHOWN_HUNKS:
        lines.append(f"... and {plural(len(hunks) - SHOWN_HUNKS, 'more hunk')} (--diff shows them all)")
    return lines


def summary_line(out_dir: Path, outcome: FileMerge, accepted: bool) -> str | None:
    """What a rebuild that wrote did to an edited file; None for the others."""
    path, kind = outcome.path, outcome.kind
    if accepted and kind in (Kind.CONFLICT, Kind.NO_BASE):
        return f"{out_dir}: accepted your {path} as it is (recorded against the new generation)"
    if kind == Kind.MERGED:
        merge = outcome.merge
        return (
            f"{out_dir}: merged your edits into {path} ({plural(merge.kept, 'edit')} of yours kept, "
            f"{plural(merge.applied, 'change')} of the new generation applied)"
        )
    if kind == Kind.KEPT:
        return f"{out_dir}: kept your edits to {path} (the new generation does not change it)"
    if kind == Kind.DROPPED_EDITED:
        return f"{out_dir}: left your {path} in place: parc no longer generates it, and it is yours now"
    return None


def _diff(old: bytes | None, new: bytes | None, old_name: str, new_name: str) -> list[str]:
    def lines(data):
        return [] if data is None else data.decode("utf-8", errors="replace").splitlines(keepends=True)

    out = []
    for line in difflib.unified_diff(lines(old), lines(new), old_name, new_name):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return out


def diff_text(out_dir: Path, rebuild: Rebuild) -> str:
    """``--diff``: per file, yours against its base, then on disk against what would be written."""
    chunks: list[str] = []
    for outcome in rebuild.outcomes:
        name = str(out_dir / outcome.path)
        disk = name if outcome.on_disk is not None else "/dev/null"
        if outcome.kind in (Kind.KEPT, Kind.MERGED, Kind.CONFLICT, Kind.DROPPED_EDITED) and outcome.base is not None:
            chunks += _diff(outcome.base, outcome.on_disk, f"{name}\t(last generated)", f"{name}\t(yours)")
        if outcome.kind in (Kind.STALE, Kind.MISSING, Kind.MERGED, Kind.DROPPED):
            target = outcome.merge.text if outcome.kind == Kind.MERGED else outcome.new
            chunks += _diff(outcome.on_disk, target, f"{disk}\t(on disk)",
                            f"{name if target is not None else '/dev/null'}\t(would be written)")
        elif outcome.kind == Kind.CONFLICT:
            chunks += _diff(outcome.on_disk, outcome.merge.text, f"{disk}\t(on disk)", f"{name}\t(--write-conflicts)")
        elif outcome.kind in (Kind.NO_BASE, Kind.MARKERS, Kind.UNPARSED):
            chunks += _diff(outcome.on_disk, outcome.new, f"{disk}\t(on disk)", f"{name}\t(new generation, --force)")
    return "".join(chunks)
