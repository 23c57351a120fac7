"""A build folder on disk: its record, base texts and files, read and written safely.

Takes: a folder a user named (``-o DIR``) and the paths of a build. Gives: the
manifest's record (``read_record``), the base texts under ``.parc/base/`` (what parc
generated last, ``read_base``), the user's files (``read_on_disk``), backup names for
``--force`` and the atomic ``write``. Before: ``codegen/build.py`` (``generate``).
After: ``codegen/build_merge.py``, which decides per file what a rebuild does.

Note [a build folder is untrusted input]: a cloned repository can carry a build
folder, manifest and base texts included. The manifest is checked against
``MANIFEST_SCHEMA`` and every path in it (and every path the build reads or writes,
``.parc/base/`` and backups included) must stay inside the folder once symlinks are
followed (``runtime/paths.py``); otherwise ``FolderError`` is raised before anything
is read, written or removed — ``--force`` does not lift it. Base texts and the
user's files are read as regular files of bounded size; a base whose sha256 is not
the manifest's is not used (the file then has no base to merge against).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import jsonschema

from parc import __version__
from parc.runtime.paths import (
    MissingFile,
    UnreadableFile,
    UnsafePath,
    UnwritablePath,
    check_target,
    inside,
    read_json,
    read_limited,
)

MANIFEST = ".parc/manifest.json"
BASES = ".parc/base/"
"""Where the text parc generated last for each file lies: ``.parc/base/train.py``."""
FORMAT = 2
"""The manifest's format: 2 stores base texts; a manifest without ``format`` (1) has none."""
FILE_LIMIT = 16 * 2**20
"""Bytes of a base text or a user's file parc reads at most to merge (a train.py is ~20 kB)."""
EXECUTABLE = {"launch.sh", "slurm.sbatch"}
MANIFEST_LIMIT = 16 * 2**20
"""Bytes of ``.parc/manifest.json`` parc reads at most (a real one is a few kB)."""
MANIFEST_SCHEMA = {
    "type": "object",
    "required": ["files"],
    "properties": {
        "format": {"type": "integer", "minimum": 1},
        "parc_version": {"type": "string"},
        "spec": {"type": "string"},
        "spec_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "set": {"type": "array", "items": {"type": "string"}, "maxItems": 10000},
        "files": {
            "type": "object",
            "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        },
    },
}
"""What ``.parc/manifest.json`` must look like before parc believes a word of it."""


class FolderError(Exception):
    """A build folder parc must not touch: a bad manifest, a path leading out, not a folder."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def with_bases(files: dict[str, bytes]) -> dict[str, bytes]:
    """``files`` and, for each generated file, its base text ``.parc/base/<path>``."""
    bases = {BASES + path: data for path, data in files.items() if path != MANIFEST}
    return dict(sorted({**files, **bases}.items()))


@dataclass(frozen=True, slots=True)
class Record:
    """What a folder's manifest says parc wrote."""

    files: dict[str, str]
    """path → sha256 of the text parc generated (the base)."""
    bases: bool
    """The folder keeps base texts (format 2); a manifest of format 1 has none."""
    sets: tuple[str, ...] = ()
    """The ``--set`` values it was built with, in order (Note [the build records its --set])."""


def check_folder(out_dir: Path) -> None:
    """Refuse an output path that is not (and cannot become) a folder parc may write
    (``runtime/paths.check_target``, the rule every writer of a user path follows)."""
    try:
        check_target(out_dir, folder=True)
    except UnwritablePath as exc:
        hint = "check its permissions, or name another folder" if "writable" in str(exc) else "name a folder with -o DIR"
        raise FolderError(str(exc), hint) from None


def read_record(out_dir: Path) -> Record | None:
    """What the folder's manifest records; None when it has none.

    Raises ``FolderError`` for a manifest that is unreadable, of the wrong shape, of a
    newer format, or names a path outside the folder (Note [a build folder is untrusted input]).
    """
    manifest_path = out_dir / MANIFEST
    hint = f"if you trust this folder, delete {manifest_path} and build again; else build into a new folder"
    try:
        inside(out_dir, MANIFEST)
    except UnsafePath as exc:
        raise FolderError(f"{manifest_path}: {exc}", hint) from None
    if not manifest_path.exists() and not manifest_path.is_symlink():
        return None
    try:  # a regular file, bounded, UTF-8, finite numbers (a FIFO or /dev/zero cannot hang it)
        document = read_json(manifest_path, limit=MANIFEST_LIMIT)
    except UnreadableFile as exc:  # it names the file and what is wrong
        raise FolderError(f"{exc}: not a parc manifest", hint) from None
    except OSError as exc:
        raise FolderError(f"{manifest_path} is not a parc manifest: {_reason(exc)}", hint) from None
    try:
        jsonschema.validate(document, MANIFEST_SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "".join(f"[{part!r}]" for part in exc.absolute_path) or "the document"
        raise FolderError(f"{manifest_path} is not a parc manifest: {where}: {exc.message}", hint) from None
    version = document.get("format", 1)
    if version > FORMAT:
        raise FolderError(
            f"{manifest_path} has format {version}; this parc ({__version__}) reads format {FORMAT} at most",
            "build with the newer parc that wrote it, or into a new folder",
        )
    for name in document["files"]:
        if name == ".parc" or name.startswith(".parc/"):
            raise FolderError(f"{manifest_path} lists parc's own record {name!r} as a file of the build", hint)
        try:
            inside(out_dir, name)
            if version >= 2:
                inside(out_dir, BASES + name)
        except UnsafePath as exc:
            raise FolderError(f"{manifest_path} lists a file outside the build folder: {exc}", hint) from None
    return Record(files=dict(sorted(document["files"].items())), bases=version >= 2,
                  sets=tuple(document.get("set", ())))


def read_manifest(out_dir: Path) -> dict[str, str] | None:
    """The files the folder's manifest records (path → sha256); None when it has none."""
    record = read_record(out_dir)
    return None if record is None else record.files


def read_on_disk(out_dir: Path, path: str) -> bytes | None:
    """The bytes of ``path`` in the folder as the user left them; None when there is none.

    ``FolderError`` for a path leading out, or something that is not a regular file of
    at most ``FILE_LIMIT`` bytes (a FIFO cannot hang the build)."""
    target = _inside_or_refuse(out_dir, path)
    if not target.exists() and not target.is_symlink():
        return None
    try:
        return read_limited(target, limit=FILE_LIMIT)
    except UnreadableFile as exc:
        raise FolderError(f"{exc}: parc neither merges nor replaces it", "move it aside, or build into a new folder") from None


def read_base(out_dir: Path, record: Record, path: str) -> tuple[bytes | None, str]:
    """The base text of ``path`` (what parc generated last) and, when there is none, why."""
    if path not in record.files:
        return None, "parc did not write it (it is not in .parc/manifest.json)"
    if not record.bases:
        return None, "the folder was built by a parc that kept no base texts in .parc/"
    target = _inside_or_refuse(out_dir, BASES + path)
    try:
        data = read_limited(target, limit=FILE_LIMIT)
    except MissingFile:
        return None, f"its base text {BASES}{path} is missing"
    except UnreadableFile as exc:
        return None, f"its base text is unusable: {exc}"
    if sha256(data) != record.files[path]:
        return None, f"its base text {BASES}{path} does not match the manifest's sha256"
    return data, ""


def backup_name(out_dir: Path, path: str, data: bytes) -> str:
    """Where ``--force`` saves the user's ``path``: ``path.orig``, else ``path.orig.1``, ...

    A backup already holding ``data`` is reused; any other file there is never replaced."""
    for index in range(1000):
        name = f"{path}.orig" + (f".{index}" if index else "")
        target = _inside_or_refuse(out_dir, name)
        if not target.exists() and not target.is_symlink():
            return name
        if target.is_file() and not target.is_symlink() and read_on_disk(out_dir, name) == data:
            return name
    raise FolderError(f"{out_dir}: no free name for a backup of {path}", f"delete old {path}.orig.* files")


def _inside_or_refuse(out_dir: Path, path: str) -> Path:
    try:
        return inside(out_dir, path)
    except UnsafePath as exc:
        raise FolderError(f"{out_dir}: cannot use {path}: {exc}", "remove the symlink, or build into a new folder") from None


def check_writable(out_dir: Path, path: str) -> None:
    """``path`` can be written: inside the folder, under folders, not onto a folder."""
    try:
        target = inside(out_dir, path)  # a symlinked subfolder must not carry a write outside
    except UnsafePath as exc:
        raise FolderError(f"{out_dir}: cannot write {path}: {exc}", "remove the symlink, or build into a new folder") from None
    parts = Path(path).parts
    for depth in range(1, len(parts)):
        folder = out_dir.joinpath(*parts[:depth])
        if folder.exists() and not folder.is_dir():
            raise FolderError(f"{out_dir}: cannot write {path}: {folder} is a file, not a folder", "move it aside, or build into a new folder")
    if target.is_dir():
        raise FolderError(f"{out_dir}: cannot write {path}: a folder is in its place", "move it aside, or build into a new folder")


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc).splitlines()[0][:200]


def write(out_dir: Path, files: dict[str, bytes], *, delete: tuple[str, ...] = ()) -> None:
    """Write ``files`` atomically (temp file + rename), then remove the files in ``delete``.

    Every path is checked again here, so no caller can make this touch a file outside
    ``out_dir``. The manifest goes last: a write that fails half-way leaves the old record.
    """
    for path in [*files, *delete]:
        check_writable(out_dir, path)
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, data in sorted(files.items(), key=lambda item: item[0] == MANIFEST):
        target = out_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file() and not target.is_symlink() and target.read_bytes() == data:
            continue
        tmp = target.with_name(f".{target.name}.parc-tmp")
        tmp.write_bytes(data)
        os.chmod(tmp, 0o755 if path in EXECUTABLE else 0o644)
        os.replace(tmp, target)
    for path in sorted(delete):
        target = inside(out_dir, path)
        if target.is_file() or target.is_symlink():
            target.unlink()  # a symlink (resolving inside) goes itself, never what it points at
