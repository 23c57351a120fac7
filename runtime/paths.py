"""Files and paths a user (or a cloned repository) controls: read them safely.

Takes: a folder and a relative path that some file on disk named (a build's manifest,
a checkpoint's index), or the path of a file to read (a profile, ``parc.json``).
Gives: ``inside`` — the path inside the folder, or ``UnsafePath`` saying why it was
refused (absolute, empty, ``.``/``..`` parts, backslashes or NUL bytes, or — symlinks
followed — landing outside the folder); ``read_limited`` and ``read_json`` — a regular
file's bytes (at most ``MAX_BYTES``) or its JSON document, or ``UnreadableFile``
with one line naming the file and what is wrong (``MissingFile`` when there is none);
``check_target`` — a path a file or folder can be written to, else ``UnwritablePath``.
Plain Python, no torch: the code generator (``parc build``, ``parc plan``, ``parc
export``) and the generated trainer (checkpoints, token files) call the same rules.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path, PurePosixPath

MAX_BYTES = 64 * 2**20
"""The most ``read_limited`` reads of a small file (a profile, a manifest, ``parc.json``)."""


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


class UnreadableFile(ValueError):
    """A file that cannot be read as what it should be; the message names it and says why."""


class MissingFile(UnreadableFile):
    """There is no file at the path (a CLI's usage error, exit 2)."""


def check_regular(path: str | os.PathLike) -> os.stat_result:
    """The ``stat`` of the regular file at ``path`` (symlinks followed), else ``UnreadableFile``."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise UnreadableFile(f"{path} is a symlink to nothing ({os.readlink(path)})") from None
        raise MissingFile(f"{path}: no such file") from None
    except OSError as exc:  # a file under a file (ENOTDIR), a loop of symlinks, no permission
        raise UnreadableFile(f"{path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise UnreadableFile(f"{path} is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise UnreadableFile(f"{path} is not a regular file (a device, pipe or socket)")
    return info


def read_limited(path: str | os.PathLike, *, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file at ``path``; ``UnreadableFile`` past ``limit`` bytes."""
    size = check_regular(path).st_size
    too_big = f"{path} is larger than the {limit // 2**20} MiB parc reads of it: not the file it should be"
    if size > limit:
        raise UnreadableFile(too_big)
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)  # the file may have grown since stat
    except OSError as exc:
        raise UnreadableFile(f"{path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise UnreadableFile(too_big)
    return data


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large for a number")
    return value


def read_json(path: str | os.PathLike, *, limit: int = MAX_BYTES):
    """The JSON document in the file at ``path`` (UTF-8, finite numbers only), else ``UnreadableFile``."""
    data = read_limited(path, limit=limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise UnreadableFile(f"{path} is not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # NaN, Infinity, 1e999; nesting too deep
        raise UnreadableFile(f"{path} is not JSON parc accepts: {str(exc) or 'nested too deeply'}") from None


def json_path(parts) -> str:
    """A place in a JSON document as ``["matmul"][2]["flops"]`` (the whole document: ``the document``)."""
    return "".join(f"[{json.dumps(part)}]" for part in parts) or "the document"


class UnwritablePath(ValueError):
    """A path a file or folder cannot be written to; the message names it and says why."""


def check_target(path: str | os.PathLike, *, folder: bool) -> None:
    """``path`` can be written: as a folder (one, or one that can be made) or a regular file.

    Refused: a symlink to nothing, a file where a folder belongs (or the reverse), a
    device or pipe (``/dev/null``), a path under a file, a folder without write access.
    A file is written next to itself and renamed, so its folder must be writable.
    """
    name = os.fspath(path)
    if os.path.islink(name) and not os.path.exists(name):
        raise UnwritablePath(f"{name} is a symlink to nothing ({os.readlink(name)})")
    if os.path.exists(name):
        if folder and not os.path.isdir(name):
            raise UnwritablePath(f"{name} exists and is not a folder")
        if not folder and os.path.isdir(name):
            raise UnwritablePath(f"{name} is a folder, not a file")
        if not folder and not os.path.isfile(name):
            raise UnwritablePath(f"{name} is not a regular file (a device, pipe or socket)")
        where = name if folder else os.path.dirname(os.path.abspath(name))
        if not os.access(where, os.W_OK | os.X_OK):
            raise UnwritablePath(f"{name} is not writable ({where} is read-only)" if where != name else f"{name} is not writable")
        return
    parent = os.path.dirname(os.path.abspath(name))
    while not os.path.exists(parent) and parent != os.path.dirname(parent):
        if os.path.islink(parent):
            raise UnwritablePath(f"cannot make {name}: {parent} is a symlink to nothing")
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UnwritablePath(f"cannot make {name}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UnwritablePath(f"cannot make {name}: {parent} is not writable")
