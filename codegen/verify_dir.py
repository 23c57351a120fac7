"""``parc verify DIR``: the proof of ``parc verify`` for a build folder, hand edits included.

Takes: a build folder (untrusted input: Note [a build folder is untrusted input] of
``codegen/build.py``), the spec it was built from (``--spec``, else the file its manifest
names, looked for next to the folder and in the cwd) and the ``--set`` values it was
built with. Gives: the ``Verdict`` of ``codegen/verify.py``, the layout run being a COPY
of the folder, shrunk; the folder itself is never written.

Note [shrinking an edited train.py]: the shrink is a change of parc's own output, so it
is applied as a three-way merge of the folder's ``train.py``: the base is what parc wrote
for the spec (its sha256 must be the manifest's), one side is the user's file, the other
is what parc writes for the shrunk spec (``codegen/shrink.py``: its constants block, and
the autocast lines fp32 drops). Hand edits away from those lines are kept as written;
an edit of a line the shrink changes (say ``HIDDEN = 4096`` by hand) is a conflict,
named by its line, and verify stops. Other files the user edited (``parc_runtime/``,
modules they added) are copied as they are. Before: ``codegen/cli/verify.py``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path, PurePosixPath

from parc.runtime.paths import UnreadableFile, UnsafePath, check_regular, inside, read_json, read_limited

from .build import generate, load_built, spec_hash
from .build_folder import MANIFEST, MANIFEST_LIMIT, FolderError, read_manifest, sha256, write
from .build_merge import Hunk, three_way
from .verify import MAX_RANKS, STEPS, Verdict, VerifyError, build_into, compare, describe, prepare, run_pair

COPIED = (".py", ".cpp", ".h", ".cu", ".json", ".md", ".sh", ".sbatch")
"""What the copy of a build folder takes besides the manifest's files: sources and
small text files a trainer may read; never checkpoints or data."""
COPY_LIMIT = 16 * 2**20


# ---- the folder ---------------------------------------------------------------------


def _manifest(folder: Path) -> tuple[dict, dict]:
    """(files, the whole manifest), the manifest checked as ``parc build`` checks it."""
    try:
        files = read_manifest(folder)
    except FolderError as exc:
        raise VerifyError(str(exc), exc.hint) from None
    if files is None:
        raise VerifyError(f"{folder} is not a parc build (no {MANIFEST})", "give a folder `parc build` wrote, or a spec")
    return files, read_json(folder / MANIFEST, limit=MANIFEST_LIMIT)


def _find_spec(folder: Path, given: str | None, manifest: dict) -> str:
    if given:
        return given
    name = manifest.get("spec")
    hint = "name it: parc verify DIR --spec SPEC (and the --set it was built with)"
    if not isinstance(name, str) or len(PurePosixPath(name).parts) != 1 or name in (".", ".."):
        raise VerifyError(f"{folder / MANIFEST} names no spec file", hint)
    for place in (folder.parent, Path.cwd()):
        candidate = place / name
        if candidate.is_file():
            return str(candidate)
    raise VerifyError(f"{folder} was built from {name}, found neither next to it nor in the cwd", hint)


def _spec_of(folder: Path, spec_path: str, overrides: list[str], manifest: dict, files: dict):
    """The spec the folder was built from, and what parc wrote for it (checked against the manifest)."""
    spec = load_built(spec_path, overrides, folder)  # hashed as the build hashed it
    if manifest.get("spec_sha256") not in (None, spec_hash(spec)):
        raise VerifyError(
            f"{folder} was not built from {spec_path}" + (" with these --set values" if overrides else ""),
            "pass the spec and the --set values it was built with (`parc build --check` tells the same)",
        )
    base = generate(spec, overrides=tuple(overrides))
    if files.get("train.py") != sha256(base["train.py"]):
        raise VerifyError(
            f"{folder}/train.py was written by another version of parc (its manifest's record is not "
            "what this parc writes), so verify cannot tell your edits from parc's",
            "rebuild the folder with this parc (your edits: `parc build --check` names the files), "
            "or verify with the parc that made it",
        )
    return base


def _read_train(folder: Path) -> str:
    try:
        path = inside(folder, "train.py")
        return read_limited(path, limit=COPY_LIMIT).decode("utf-8")
    except (UnsafePath, UnreadableFile, UnicodeDecodeError, OSError) as exc:
        raise VerifyError(f"{folder}/train.py cannot be read: {exc}") from None


def _copy(folder: Path, into: Path, listed: dict) -> None:
    """Copy the folder's sources into ``into``: regular files inside it, no symlinks."""
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_symlink() or not path.is_file() or relative.parts[0] == ".parc":
            continue
        if relative.as_posix() not in listed and path.suffix not in COPIED:
            continue
        try:
            inside(folder, relative.as_posix())
            if check_regular(path).st_size > COPY_LIMIT:
                continue
        except (UnsafePath, UnreadableFile, OSError):
            continue
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def _edited(folder: Path, listed: dict) -> list[str]:
    edited = []
    for name, digest in sorted(listed.items()):
        try:
            path = inside(folder, name)
            if path.is_file() and sha256(read_limited(path, limit=COPY_LIMIT)) != digest:
                edited.append(name)
        except (UnsafePath, UnreadableFile, OSError):
            continue
    return edited


def _conflict_error(folder: Path, hunk: Hunk) -> VerifyError:
    before = b"".join(hunk.base or ()).decode().strip() or "(nothing)"
    after = b"".join(hunk.new).decode().strip() or "(nothing)"
    base = hunk.base or ()
    edited = next((i for i, line in enumerate(hunk.yours) if i >= len(base) or line != base[i]), 0)
    return VerifyError(
        f"{folder}/train.py:{hunk.yours_line + edited}: your edit there touches lines the shrink must change",
        "verify shrinks the constants parc wrote; undo that edit for the check, or verify the spec",
        f"parc wrote:      {before}\nthe shrink needs: {after}",
    )


def verify_folder(folder: Path, spec_arg: str | None, overrides: list[str], workdir: Path, *,
                  steps: int = STEPS, timeout: float = 600, max_ranks: int = MAX_RANKS) -> Verdict:
    """``parc verify DIR`` (Note [shrinking an edited train.py])."""
    start = time.perf_counter()
    listed, manifest = _manifest(folder)
    if not overrides and isinstance(manifest.get("set"), list):  # Note [the build records its --set]
        overrides = [str(item) for item in manifest["set"]]
    spec_path = _find_spec(folder, spec_arg, manifest)
    base = _spec_of(folder, spec_path, overrides, manifest, listed)
    prepared = prepare(spec_path, overrides, steps=steps, max_ranks=max_ranks)
    shrunk = generate(prepared.layout_spec)
    merge = three_way(base["train.py"], _read_train(folder).encode(), shrunk["train.py"])
    if merge.hunks:
        raise _conflict_error(folder, merge.hunks[0])
    merged = merge.text.decode()
    layout_folder = workdir / "layout"
    _copy(folder, layout_folder, listed)
    # Runtime files the shrunk program needs and the folder lacks (none, unless deleted).
    write(layout_folder, {p: d for p, d in shrunk.items() if p != MANIFEST and not (layout_folder / p).exists()})
    (layout_folder / "train.py").write_text(merged, encoding="utf-8")
    reference_folder = build_into(prepared.reference_spec, workdir / "one-rank")
    reference, layout = run_pair(layout_folder, reference_folder, world=prepared.shrink.world, steps=steps,
                                 timeout=timeout)
    edited = _edited(folder, listed)
    notes = (
        f"build folder: {folder} (built from {spec_path}); run as a shrunk copy, the folder untouched",
        "hand-edited files, kept: " + (", ".join(edited) if edited else "none"),
    )
    return Verdict(
        layout=describe(prepared.layout_plan), world=prepared.shrink.world, shrink=prepared.shrink,
        reference_overrides=prepared.shrink.reference, records=compare(reference, layout, steps),
        seconds=time.perf_counter() - start, notes=notes, command=prepared.command,
    )
