"""Build folders: write them, check them, and never clobber a user's edits.

Takes: a ``Plan`` (or a spec path). Gives: the files of a build — the rendered ones,
the byte-identical ``parc_runtime/`` copy of ``runtime/`` and ``.parc/manifest.json``
(parc version, spec hash, each file's sha256) — and the comparison of a folder on
disk with what would be generated: stale (would change), missing, hand-edited
(differs from what the manifest recorded), so ``--check`` and overwrite protection
read the same facts. Before: ``codegen/render.py``. After: the user's ``torchrun``.

Note [a build folder is untrusted input]: a cloned repository can carry a build
folder, manifest included. The manifest is checked against ``MANIFEST_SCHEMA`` and
every path in it (and every path the build writes) must stay inside the folder once
symlinks are followed (``runtime/paths.py``); otherwise ``FolderError`` is raised
before anything is read, written or removed — ``--force`` does not lift it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jsonschema

from parc import __version__
from parc.runtime.paths import UnreadableFile, UnsafePath, UnwritablePath, check_target, inside, read_json

from .lower import lower
from .render import render, runtime_modules

MANIFEST = ".parc/manifest.json"
EXECUTABLE = {"launch.sh", "slurm.sbatch"}
MANIFEST_LIMIT = 16 * 2**20
"""Bytes of ``.parc/manifest.json`` parc reads at most (a real one is a few kB)."""
MANIFEST_SCHEMA = {
    "type": "object",
    "required": ["files"],
    "properties": {
        "parc_version": {"type": "string"},
        "spec": {"type": "string"},
        "spec_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
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


def runtime_files(modules: set[str] | None = None) -> dict[str, bytes]:
    """The source files of parc's runtime a build needs, as ``parc_runtime/...`` → bytes.

    ``modules``: the top-level runtime modules the program uses (``render.runtime_modules``);
    the modules they import at module level follow, and a package (``kernels``) travels
    whole with its C++ sources. None: every file (the whole runtime).
    """
    root = resources.files("parc.runtime")
    out: dict[str, bytes] = {}
    wanted = None if modules is None else _closure(root, set(modules))

    def walk(node, prefix, top):
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir():
                if child.name != "__pycache__" and (top is not None or wanted is None or child.name in wanted):
                    walk(child, f"{prefix}{child.name}/", child.name)
            elif child.name.endswith((".py", ".cpp", ".h", ".cu")):
                name = child.name[: -len(".py")]
                if top is not None or wanted is None or name == "__init__" or name in wanted:
                    out[f"{prefix}{child.name}"] = child.read_bytes()

    walk(root, "parc_runtime/", None)
    return out


def _closure(root, modules: set[str]) -> set[str]:
    """``modules`` and every runtime module they import at module level (``from .x``)."""
    import ast

    seen: set[str] = set()
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        node = root.joinpath(name)
        sources = [c for c in node.iterdir() if c.name.endswith(".py")] if node.is_dir() else [root.joinpath(f"{name}.py")]
        for source in sources:
            for statement in ast.parse(source.read_text(encoding="utf-8")).body:
                if not isinstance(statement, ast.ImportFrom) or statement.level == 0:
                    continue
                if statement.level == (2 if node.is_dir() else 1):  # the runtime's own top level
                    if statement.module:
                        todo.append(statement.module.split(".")[0])
                    else:
                        todo.extend(alias.name for alias in statement.names)
    return seen


def spec_hash(spec) -> str:
    from parc.dsl import spec_to_dict

    # The values only: where the file lies (``source``) must not change the build.
    values = {k: v for k, v in spec_to_dict(spec).items() if k != "source"}
    return sha256(json.dumps(values, sort_keys=True).encode())


def generate(spec, plan=None) -> dict[str, bytes]:
    """Everything a build folder holds, path → bytes (the manifest included).

    ``plan``: the spec's lowered ``Plan`` when the caller has it already (lowered once)."""
    plan = lower(spec) if plan is None else plan
    files = {path: text.encode() for path, text in render(plan).items()}
    files.update(runtime_files(runtime_modules(plan)))
    manifest = {
        "parc_version": __version__,
        "spec": plan.source,
        "spec_sha256": spec_hash(spec),
        "files": {path: sha256(data) for path, data in sorted(files.items())},
    }
    files[MANIFEST] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    return dict(sorted(files.items()))


@dataclass(frozen=True, slots=True)
class FolderState:
    """How a folder on disk compares with a fresh build."""

    stale: tuple[str, ...]
    """parc wrote them (they match the manifest) but the new build differs."""
    missing: tuple[str, ...]
    edited: tuple[str, ...]
    """Differ from what the manifest says parc wrote: someone edited them."""
    unmanaged: bool
    """The folder is non-empty and has no manifest: parc did not make it."""

    @property
    def fresh(self) -> bool:
        return not (self.stale or self.missing or self.edited or self.unmanaged)


def check_folder(out_dir: Path) -> None:
    """Refuse an output path that is not (and cannot become) a folder parc may write
    (``runtime/paths.check_target``, the rule every writer of a user path follows)."""
    try:
        check_target(out_dir, folder=True)
    except UnwritablePath as exc:
        hint = "check its permissions, or name another folder" if "writable" in str(exc) else "name a folder with -o DIR"
        raise FolderError(str(exc), hint) from None


def read_manifest(out_dir: Path) -> dict[str, str] | None:
    """The files the folder's manifest records (path → sha256); None when it has none.

    Raises ``FolderError`` for a manifest that is unreadable, of the wrong shape, or
    names a path outside the folder (Note [a build folder is untrusted input]).
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
    for name in document["files"]:
        try:
            inside(out_dir, name)
        except UnsafePath as exc:
            raise FolderError(f"{manifest_path} lists a file outside the build folder: {exc}", hint) from None
    return document["files"]


def _check_writable(out_dir: Path, path: str) -> None:
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


def compare(out_dir: Path, files: dict[str, bytes]) -> FolderState:
    """How ``out_dir`` differs from ``files``; ``FolderError`` when parc must not touch it."""
    check_folder(out_dir)
    manifest = read_manifest(out_dir)
    recorded: dict[str, str] = manifest or {}
    unmanaged = manifest is None and out_dir.is_dir() and any(out_dir.iterdir())
    for path in files:
        _check_writable(out_dir, path)
    stale, missing, edited = [], [], []
    for path, data in files.items():
        target = out_dir / path
        if not target.is_file():
            missing.append(path)
            continue
        on_disk = sha256(target.read_bytes())
        if path != MANIFEST and path in recorded and on_disk != recorded[path]:
            edited.append(path)
        elif path != MANIFEST and path not in recorded and on_disk != sha256(data) and not unmanaged:
            edited.append(path)
        elif on_disk != sha256(data):
            stale.append(path)
    # Files parc wrote before but no longer generates are stale too.
    for path in sorted(set(recorded) - set(files)):
        target = out_dir / path
        if target.is_file():
            (edited if sha256(target.read_bytes()) != recorded[path] else stale).append(path)
    return FolderState(tuple(stale), tuple(missing), tuple(edited), unmanaged)


def write(out_dir: Path, files: dict[str, bytes], *, previous: dict[str, str] | None = None) -> None:
    """Write ``files`` atomically (temp file + rename); drop files parc no longer makes.

    ``previous`` comes from ``read_manifest`` and every path is checked again here,
    so no caller can make this touch a file outside ``out_dir``.
    """
    for path in [*files, *(previous or {})]:
        inside(out_dir, path)
    out_dir.mkdir(parents=True, exist_ok=True)
    # The manifest goes last: a write that fails half-way leaves the old record.
    for path, data in sorted(files.items(), key=lambda item: item[0] == MANIFEST):
        target = out_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file() and target.read_bytes() == data:
            continue
        tmp = target.with_name(f".{target.name}.parc-tmp")
        tmp.write_bytes(data)
        os.chmod(tmp, 0o755 if path in EXECUTABLE else 0o644)
        os.replace(tmp, target)
    for path in sorted(set(previous or {}) - set(files)):
        target = inside(out_dir, path)
        if target.is_file() or target.is_symlink():
            target.unlink()  # a symlink (resolving inside) goes itself, never what it points at


def recorded_files(out_dir: Path) -> dict[str, str]:
    """The manifest's files (``read_manifest``), {} when there is none."""
    return read_manifest(out_dir) or {}


def seen_from(spec, out_dir):
    """``spec`` with its token file's path as ``out_dir/train.py`` finds it.

    A relative path in a spec is relative to the spec's folder (``Spec.resolve``); the
    trainer resolves ``DATA_PATH`` against its own folder, so the build records the path
    from ``out_dir`` to the file: the printed ``cd OUT && torchrun ...`` works, and no
    absolute path enters the build (an absolute one written in the spec stays as is)."""
    from dataclasses import replace

    data = spec.train.data
    if data.path is None or os.path.isabs(data.path):
        return spec
    path = Path(os.path.relpath(spec.resolve(data.path), out_dir)).as_posix()
    return replace(spec, train=replace(spec.train, data=replace(data, path=path)))


def build_to(spec_path, out_dir, overrides=(), *, force: bool = True) -> Path:
    """Load, lower, render and write a build; for tests and benchmarks.

    Raises ``Diagnostics`` on spec errors. ``force`` (default on here) overwrites.
    """
    from parc.dsl import load

    out_dir = Path(out_dir)
    spec = seen_from(load(str(spec_path), list(overrides)), out_dir)
    files = generate(spec)
    if not force:
        state = compare(out_dir, files)
        if state.edited or state.unmanaged:
            raise FileExistsError(f"{out_dir}: hand-edited or unmanaged files: {state.edited}")
    write(out_dir, files, previous=recorded_files(out_dir))
    return out_dir
