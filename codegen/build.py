"""Build folders: write them, check them, and never clobber a user's edits.

Takes: a ``Plan`` (or a spec path). Gives: the files of a build — the rendered ones,
the byte-identical ``parc_runtime/`` copy of ``runtime/`` and ``.parc/manifest.json``
(parc version, spec hash, each file's sha256) — and the comparison of a folder on
disk with what would be generated: stale (would change), missing, hand-edited
(differs from what the manifest recorded), so ``--check`` and overwrite protection
read the same facts. Before: ``codegen/render.py``. After: the user's ``torchrun``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from parc import __version__

from .lower import lower
from .render import render

MANIFEST = ".parc/manifest.json"
EXECUTABLE = {"launch.sh", "slurm.sbatch"}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def runtime_files() -> dict[str, bytes]:
    """Every source file of parc's runtime, as ``parc_runtime/...`` → bytes."""
    root = resources.files("parc.runtime")
    out: dict[str, bytes] = {}

    def walk(node, prefix):
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir():
                if child.name != "__pycache__":
                    walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith((".py", ".cpp", ".h", ".cu")):
                out[f"{prefix}{child.name}"] = child.read_bytes()

    walk(root, "parc_runtime/")
    return out


def spec_hash(spec) -> str:
    from parc.dsl import spec_to_dict

    # The values only: where the file lies (``source``) must not change the build.
    values = {k: v for k, v in spec_to_dict(spec).items() if k != "source"}
    return sha256(json.dumps(values, sort_keys=True).encode())


def generate(spec) -> dict[str, bytes]:
    """Everything a build folder holds, path → bytes (the manifest included)."""
    plan = lower(spec)
    files = {path: text.encode() for path, text in render(plan).items()}
    files.update(runtime_files())
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


def compare(out_dir: Path, files: dict[str, bytes]) -> FolderState:
    manifest_path = out_dir / MANIFEST
    recorded: dict[str, str] = {}
    unmanaged = False
    if manifest_path.is_file():
        try:
            recorded = json.loads(manifest_path.read_text()).get("files", {})
        except (ValueError, OSError):
            unmanaged = True
    elif out_dir.is_dir() and any(out_dir.iterdir()):
        unmanaged = True
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
    """Write ``files`` atomically (temp file + rename); drop files parc no longer makes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, data in files.items():
        target = out_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file() and target.read_bytes() == data:
            continue
        tmp = target.with_name(f".{target.name}.parc-tmp")
        tmp.write_bytes(data)
        os.chmod(tmp, 0o755 if path in EXECUTABLE else 0o644)
        os.replace(tmp, target)
    for path in sorted(set(previous or {}) - set(files)):
        (out_dir / path).unlink(missing_ok=True)


def recorded_files(out_dir: Path) -> dict[str, str]:
    try:
        return json.loads((out_dir / MANIFEST).read_text()).get("files", {})
    except (OSError, ValueError):
        return {}


def build_to(spec_path, out_dir, overrides=(), *, force: bool = True) -> Path:
    """Load, lower, render and write a build; for tests and benchmarks.

    Raises ``Diagnostics`` on spec errors. ``force`` (default on here) overwrites.
    """
    from parc.dsl import load

    spec = load(str(spec_path), list(overrides))
    out_dir = Path(out_dir)
    files = generate(spec)
    if not force:
        state = compare(out_dir, files)
        if state.edited or state.unmanaged:
            raise FileExistsError(f"{out_dir}: hand-edited or unmanaged files: {state.edited}")
    write(out_dir, files, previous=recorded_files(out_dir))
    return out_dir
