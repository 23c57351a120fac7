"""What a rebuild does to each file of a build folder: write, merge, keep, or stop.

Takes: a folder and a fresh generation (``build.generate``). Gives: a ``Rebuild`` —
per file a ``FileMerge`` saying how the file on disk ("yours") relates to the text
parc generated last (the base, ``.parc/base/``) and to the new generation — and
``apply``, which writes it. ``parc build``, ``--check``, ``--diff`` and ``--accept``
read the same ``Rebuild`` (``codegen/cli/build.py`` prints it). Before:
``codegen/build_folder.py`` (the safe readers and writers). After: the user's review.

Note [3-way merge of a build]: a file the user did not edit (its sha256 is the
manifest's) simply becomes the new generation. An edited file is merged line by line
with ``merge3`` (the Bazaar/Breezy merge, base = last generated, a = yours, b = new):
regions only you changed are kept, regions only the generation changed are applied,
a region both changed differently is a conflict. A file parc has no base for (a
manifest from a parc that kept none, a file parc did not write) merges only when it
already equals the new generation — or, by the manifest's hash, when the generation
did not change it. A conflict writes nothing unless the user picks a resolution:
markers, yours replaced (after a backup), or yours accepted as it is.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import merge3

from .build_folder import (
    BASES,
    MANIFEST,
    FolderError,
    Record,
    backup_name,
    check_folder,
    check_writable,
    read_base,
    read_on_disk,
    read_record,
    sha256,
    with_bases,
    write,
)

START, BASE_MARK, MIDDLE, END = b"<<<<<<< yours", b"||||||| last generated", b"=======", b">>>>>>> new generation"
_MARKERS = re.compile(rb"^(<{7}|>{7})( |$)", re.MULTILINE)


class Kind(Enum):
    FRESH = "up to date"
    STALE = "stale"
    """Not edited; the generation changed: the new text is written."""
    MISSING = "missing"
    KEPT = "edited"
    """Edited; the generation did not change it: yours stays as it is."""
    MERGED = "edited, merges cleanly"
    CONFLICT = "edited, conflicts with the new generation"
    NO_BASE = "edited, no base to merge against"
    MARKERS = "holds conflict markers"
    UNPARSED = "edited, no longer parses"
    """An edited Python file that does not compile (a conflict half resolved, a stray edit):
    it cannot be up to date, and a merge into it would not run either."""
    DROPPED = "no longer generated"
    """Not edited, and parc no longer makes it: removed."""
    DROPPED_EDITED = "no longer generated, edited"
    """Edited, and parc no longer makes it: kept, and no longer parc's."""


EDITED = {Kind.KEPT, Kind.MERGED, Kind.CONFLICT, Kind.NO_BASE, Kind.MARKERS, Kind.UNPARSED, Kind.DROPPED_EDITED}
BLOCKED = {Kind.CONFLICT, Kind.NO_BASE, Kind.MARKERS, Kind.UNPARSED}
BY_HAND = (Kind.MARKERS, Kind.UNPARSED)
"""Files only the user can mend: no resolution but ``--force`` (which backs them up) goes past them."""
CHANGES = {Kind.STALE, Kind.MISSING, Kind.MERGED, Kind.DROPPED, Kind.DROPPED_EDITED}
"""The recorded base differs from the new generation (or the file is not on disk)."""


class Resolve(Enum):
    """What a rebuild does with files that do not merge."""

    NOTHING = "stop"  # plain `parc build`: nothing is written
    MARKERS = "--write-conflicts"
    FORCE = "--force"
    ACCEPT = "--accept"


@dataclass(frozen=True, slots=True, kw_only=True)
class Hunk:
    """One region where yours and the new generation disagree."""

    yours_line: int
    """1-based line of the file on disk where the region starts."""
    new_line: int
    base: tuple[bytes, ...] | None
    """None when there is no base (a 2-way conflict)."""
    yours: tuple[bytes, ...]
    new: tuple[bytes, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Merge:
    text: bytes
    """The merged text; conflicts as git-style markers."""
    hunks: tuple[Hunk, ...]
    kept: int
    """Regions of your edits kept."""
    applied: int
    """Regions of the new generation applied."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FileMerge:
    path: str
    kind: Kind
    on_disk: bytes | None = None
    base: bytes | None = None
    new: bytes | None = None
    merge: Merge | None = None
    """MERGED and CONFLICT: the 3-way merge; NO_BASE: the 2-way conflict."""
    reason: str = ""
    """NO_BASE: why there is no base; MARKERS: where the first marker is."""


@dataclass(frozen=True, slots=True)
class Rebuild:
    files: dict[str, bytes]
    """The new generation, manifest included."""
    outcomes: tuple[FileMerge, ...]
    unmanaged: bool
    """The folder is not empty and has no manifest: parc did not make it."""

    def of(self, *kinds: Kind) -> tuple[FileMerge, ...]:
        return tuple(outcome for outcome in self.outcomes if outcome.kind in kinds)

    @property
    def blocked(self) -> tuple[FileMerge, ...]:
        return self.of(*BLOCKED)

    @property
    def stale(self) -> bool:
        return bool(self.of(*CHANGES))

    def check_status(self) -> int:
        """``--check``: 3 an edit does not merge, 1 stale, 0 up to date (edits that merge allowed)."""
        return 3 if self.blocked else 1 if self.stale else 0


def plan_rebuild(out_dir: Path, files: dict[str, bytes]) -> Rebuild:
    """How each file of ``out_dir`` meets ``files``; ``FolderError`` when parc must not touch it."""
    check_folder(out_dir)
    record = read_record(out_dir)
    unmanaged = record is None and out_dir.is_dir() and any(out_dir.iterdir())
    for path in with_bases(files):
        check_writable(out_dir, path)
    outcomes = [_one(out_dir, record, path, new) for path, new in files.items() if path != MANIFEST]
    for path in sorted(set(record.files) - set(files)) if record else ():
        on_disk = read_on_disk(out_dir, path)
        if on_disk is not None:
            kind = Kind.DROPPED if sha256(on_disk) == record.files[path] else Kind.DROPPED_EDITED
            outcomes.append(FileMerge(path=path, kind=kind, on_disk=on_disk, base=_base_or_none(out_dir, record, path)))
    return Rebuild(files, tuple(outcomes), unmanaged)


def _one(out_dir: Path, record: Record | None, path: str, new: bytes) -> FileMerge:
    on_disk = read_on_disk(out_dir, path)
    recorded = record.files.get(path) if record else None
    if on_disk is None:
        return FileMerge(path=path, kind=Kind.MISSING, new=new)
    if recorded == sha256(on_disk):  # not edited: the file on disk is its base
        kind = Kind.FRESH if on_disk == new else Kind.STALE
        return FileMerge(path=path, kind=kind, on_disk=on_disk, base=on_disk, new=new)
    if on_disk == new:
        return FileMerge(path=path, kind=Kind.FRESH, on_disk=on_disk, base=new, new=new)
    if marker := _marker_line(on_disk):
        return FileMerge(path=path, kind=Kind.MARKERS, on_disk=on_disk, new=new, reason=f"line {marker}")
    if path.endswith(".py") and (broken := _syntax_error(on_disk)):
        return FileMerge(path=path, kind=Kind.UNPARSED, on_disk=on_disk, new=new, reason=broken)
    if recorded == sha256(new):  # the generation did not change it (the base text is not needed)
        return FileMerge(path=path, kind=Kind.KEPT, on_disk=on_disk, base=new, new=new)
    if record is None:
        base, reason = None, "the folder has no .parc/manifest.json: parc did not make it"
    else:
        base, reason = read_base(out_dir, record, path)
    if base is None:
        merge = two_way(on_disk, new)
        return FileMerge(path=path, kind=Kind.NO_BASE, on_disk=on_disk, new=new, merge=merge, reason=reason)
    merge = three_way(base, on_disk, new)
    kind = Kind.CONFLICT if merge.hunks else Kind.MERGED
    return FileMerge(path=path, kind=kind, on_disk=on_disk, base=base, new=new, merge=merge)


def _base_or_none(out_dir: Path, record: Record, path: str) -> bytes | None:
    return read_base(out_dir, record, path)[0]


def _marker_line(text: bytes) -> int:
    """The line of the first conflict marker (``<<<<<<<`` or ``>>>>>>>`` starting a line:
    one left alone is a conflict half resolved); else 0."""
    match = _MARKERS.search(text)
    return 0 if match is None else text.count(b"\n", 0, match.start()) + 1


def _syntax_error(text: bytes) -> str:
    """Why a Python file does not compile ("line 12: invalid syntax"); "" when it does."""
    try:
        compile(text, "<edited>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"line {exc.lineno}: {exc.msg}" if exc.lineno else exc.msg
    except ValueError as exc:  # a NUL byte
        return str(exc)
    return ""


def _lines(text: bytes) -> list[bytes]:
    return text.splitlines(keepends=True)


def _block(out: list[bytes], marker: bytes, lines) -> None:
    if out and not out[-1].endswith((b"\n", b"\r")):
        out[-1] += b"\n"  # a last line without a newline must not swallow the marker
    out.append(marker + b"\n")
    out.extend(lines)


def _conflict(out: list[bytes], hunk: Hunk) -> None:
    _block(out, START, hunk.yours)
    if hunk.base is not None:
        _block(out, BASE_MARK, hunk.base)
    _block(out, MIDDLE, hunk.new)
    _block(out, END, ())


def three_way(base: bytes, yours: bytes, new: bytes) -> Merge:
    """Merge yours and the new generation over their base (Note [3-way merge of a build])."""
    base_lines, your_lines, new_lines = _lines(base), _lines(yours), _lines(new)
    out: list[bytes] = []
    hunks: list[Hunk] = []
    kept = applied = 0
    for region in merge3.Merge3(base_lines, your_lines, new_lines).merge_regions():
        kind = region[0]
        if kind == "unchanged":
            out.extend(base_lines[region[1] : region[2]])
        elif kind in ("a", "same"):
            out.extend(your_lines[region[1] : region[2]])
            kept += kind == "a"
        elif kind == "b":
            out.extend(new_lines[region[1] : region[2]])
            applied += 1
        else:  # "conflict", base start, base end, a start, a end, b start, b end
            _, z0, z1, a0, a1, b0, b1 = region
            hunk = Hunk(yours_line=a0 + 1, new_line=b0 + 1, base=tuple(base_lines[z0:z1]),
                        yours=tuple(your_lines[a0:a1]), new=tuple(new_lines[b0:b1]))
            hunks.append(hunk)
            _conflict(out, hunk)
    return Merge(text=b"".join(out), hunks=tuple(hunks), kept=kept, applied=applied)


def two_way(yours: bytes, new: bytes) -> Merge:
    """Yours against the new generation without a base: every difference is a conflict."""
    your_lines, new_lines = _lines(yours), _lines(new)
    out: list[bytes] = []
    hunks: list[Hunk] = []
    matcher = difflib.SequenceMatcher(None, your_lines, new_lines, autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            out.extend(your_lines[a0:a1])
            continue
        hunk = Hunk(yours_line=a0 + 1, new_line=b0 + 1, base=None,
                    yours=tuple(your_lines[a0:a1]), new=tuple(new_lines[b0:b1]))
        hunks.append(hunk)
        _conflict(out, hunk)
    return Merge(text=b"".join(out), hunks=tuple(hunks), kept=0, applied=0)


@dataclass(frozen=True, slots=True)
class Applied:
    written: tuple[str, ...]
    """Files whose bytes changed on disk (removed ones included)."""
    backups: tuple[tuple[str, str], ...]
    """(file, where the user's version was saved) for ``--force``."""
    markers: tuple[str, ...]
    """Files written with conflict markers."""


def result(outcome: FileMerge, resolve: Resolve) -> bytes | None:
    """The bytes the rebuild leaves at ``outcome.path`` (None: removed or never there)."""
    kind = outcome.kind
    if kind in (Kind.STALE, Kind.MISSING, Kind.FRESH):
        return outcome.new
    if kind == Kind.DROPPED:
        return None
    if kind in (Kind.KEPT, Kind.DROPPED_EDITED):
        return outcome.on_disk
    if kind == Kind.MERGED:
        return outcome.merge.text
    if resolve == Resolve.ACCEPT and kind not in BY_HAND:
        return outcome.on_disk
    if resolve == Resolve.FORCE:
        return outcome.new
    if resolve == Resolve.MARKERS and kind not in BY_HAND:
        return outcome.merge.text
    raise FolderError(f"internal error in parc (build): {outcome.path} does not merge and {resolve.value} cannot resolve it", "report this bug")


def apply(out_dir: Path, rebuild: Rebuild, resolve: Resolve) -> Applied:
    """Write the rebuild: backups first (``--force``), then files, bases, the manifest last."""
    backups: list[tuple[str, str]] = []
    if resolve == Resolve.FORCE:
        for outcome in rebuild.blocked:
            name = backup_name(out_dir, outcome.path, outcome.on_disk)
            write(out_dir, {name: outcome.on_disk})
            backups.append((outcome.path, name))
    files: dict[str, bytes] = {}
    delete: list[str] = []
    written: list[str] = []
    for outcome in rebuild.outcomes:
        data = result(outcome, resolve)
        if data is None:
            delete.append(outcome.path)
        elif data != outcome.on_disk:
            files[outcome.path] = data
        if data != outcome.on_disk:
            written.append(outcome.path)
    generated = with_bases(rebuild.files)
    stale_bases = [BASES + outcome.path for outcome in rebuild.of(Kind.DROPPED, Kind.DROPPED_EDITED)]
    write(out_dir, {**files, **{path: data for path, data in generated.items() if path.startswith(BASES)},
                    MANIFEST: rebuild.files[MANIFEST]}, delete=(*delete, *stale_bases))
    markers = tuple(o.path for o in rebuild.blocked if resolve == Resolve.MARKERS)
    return Applied(tuple(written), tuple(backups), markers)
