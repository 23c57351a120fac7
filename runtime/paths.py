"""Paths read from files a user (or a cloned repository) controls, kept inside their folder.

Takes: a folder and a relative path that some file on disk named (a build's manifest,
a checkpoint's index). Gives: the path inside the folder, or ``UnsafePath`` saying why
it was refused. A path is refused when it is absolute, empty, has ``.``/``..`` parts,
backslashes or NUL bytes, or when — symlinks followed — it lands outside the folder.
Plain Python, no torch: the code generator (``parc build``) and the generated trainer
(checkpoints) call the same rule.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath


class UnsafePath(ValueError):
    """A recorded path that would reach outside its folder."""


def check_relative(name: object) -> PurePosixPath:
    """``name`` as a plain relative POSIX path, or ``UnsafePath`` with the reason."""
    if not isinstance(name, str) or not name:
        raise UnsafePath(f"{name!r} is not a file name")
    if "\\" in name or "\0" in name:
        raise UnsafePath(f"{name!r} holds a backslash or a NUL byte")
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith("/"):
        raise UnsafePath(f"{name!r} is an absolute path")
    if any(part in ("..", ".") for part in name.split("/")) or "" in name.split("/"):
        raise UnsafePath(f"{name!r} is not a plain path inside the folder ('..', '.' or an empty part)")
    return path


def inside(folder: Path, name: object) -> Path:
    """``folder / name``, checked to stay inside ``folder`` once symlinks are followed."""
    relative = check_relative(name)
    root = Path(folder).resolve()
    target = root.joinpath(*relative.parts)
    resolved = target.resolve()
    if resolved != root and root not in resolved.parents:
        raise UnsafePath(f"{name!r} leads outside the folder (through a symlink, to {resolved})")
    return target
