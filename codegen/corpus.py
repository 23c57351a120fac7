"""``parc data prepare``'s sources and its streaming token writer.

Takes: the names on the command line (files or folders), the JSON Lines field, a buffer
size. Gives: ``expand`` → the files in reading order; ``documents`` → each document as a
stream of byte pieces of bounded size; ``TokenWriter`` → the ``.bin`` and its ``.idx``
written through temporary files beside them, flushed whenever ``buffer`` tokens are held.

What a file is, by its suffix: ``.jsonl`` and ``.json`` are JSON Lines (one object a
line, the document is its ``field``, a string; a blank line is skipped); any other
named file is plain text and is one document. A folder gives its files (not its
sub-folders, not hidden files) with the suffixes ``.txt``, ``.jsonl``, ``.json``, in
sorted order; other files in it are skipped and counted (``Sources.skipped``), so a
folder of text and a stray ``README.md`` or ``.DS_Store`` reads the same.

The ``.idx`` holds one little-endian uint64 per document: the offset, in tokens, of its
first token in the ``.bin`` (the separator closes the document before it). It sits beside
the ``.bin`` as ``OUT.idx`` the way the ``.json`` does (a sibling by name, not a key in the
record: the record of the existing cases stays byte-identical, and a list of a billion
offsets does not belong in JSON).
Before: ``codegen/cli/data.py`` parses the flags. After: the trainer's ``TokenFile``.
"""

from __future__ import annotations

import json
import os
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

TEXT_SUFFIXES = (".txt",)
LINES_SUFFIXES = (".jsonl", ".json")
SPACES = b" \t\r\n\x0b\x0c"
BUFFER = 1 << 20
"""Tokens (and bytes of text) held before a write: the memory bound of a prepare."""


class CorpusError(ValueError):
    """One line for the user; ``status`` is the exit status (1 bad input, 2 a missing file)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Sources:
    files: tuple[Path, ...]
    skipped: int
    size: int
    """Bytes in all the files: what progress counts towards."""


def expand(names: list[str]) -> Sources:
    """The files named, a folder's readable ones in sorted order, each checked readable."""
    from parc.runtime.paths import MissingFile, UnreadableFile, check_regular

    files: list[Path] = []
    skipped = 0
    for name in names:
        path = Path(name)
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file())
            chosen = [p for p in inside if p.suffix.lower() in TEXT_SUFFIXES + LINES_SUFFIXES]
            skipped += len(inside) - len(chosen)
            if not chosen:
                raise CorpusError(f"{name} is a folder with no .txt, .jsonl or .json file")
            files += chosen
        else:
            files.append(path)
    size = 0
    for path in files:
        try:
            size += check_regular(path).st_size  # not a symlink to nothing, /dev/zero
        except MissingFile as exc:
            raise CorpusError(f"cannot read {exc}", 2) from None
        except UnreadableFile as exc:
            raise CorpusError(str(exc)) from None
    return Sources(tuple(files), skipped, size)


def is_lines(path: Path) -> bool:
    return path.suffix.lower() in LINES_SUFFIXES


def documents(path: Path, *, field: str, buffer: int = BUFFER, whole_lines: bool = False) -> Iterator[Iterator[bytes]]:
    """Each document of ``path`` as an iterator of byte pieces; a text file's pieces are at
    most ``buffer`` bytes. With ``whole_lines`` (a tokenizer, which must not see a word cut
    in two) a piece runs on to the end of a line that a non-space follows, where byte-level
    pre-tokenizers split anyway; a line longer than the buffer is one piece."""
    if not is_lines(path):
        yield _pieces(path, buffer, whole_lines)
        return
    try:
        with open(path, "rb") as stream:
            for number, line in enumerate(stream, 1):
                if line.strip():
                    yield iter((_field(line, path, number, field),))
    except OSError as exc:
        raise CorpusError(f"cannot read {path}: {exc.strerror or exc}") from None


def _pieces(path: Path, buffer: int, whole_lines: bool) -> Iterator[bytes]:
    try:
        with open(path, "rb") as stream:
            yield from _cut(stream, buffer, whole_lines)
    except OSError as exc:
        raise CorpusError(f"cannot read {path}: {exc.strerror or exc}") from None


def _cut(stream, buffer: int, whole_lines: bool) -> Iterator[bytes]:
    while True:
        piece = stream.read(buffer)
        if not piece:
            return
        while whole_lines:  # end after a newline that a non-space follows: a run of spaces stays whole
            if piece.endswith(b"\n"):
                following = stream.peek(1)[:1]
                if not following or following not in SPACES:
                    break
            more = stream.readline()
            if not more:
                break
            piece += more
        yield piece


def _field(line: bytes, path: Path, number: int, field: str) -> bytes:
    try:
        record = json.loads(line)
    except ValueError as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        also = " (a .json file is read as JSON Lines: one object a line)" if path.suffix.lower() == ".json" else ""
        raise CorpusError(f"{path}:{number}: not a JSON line ({reason}){also}") from None
    if not isinstance(record, dict) or field not in record:
        raise CorpusError(f"{path}:{number}: no field {field!r} in this line (choose the field with --field NAME)")
    text = record[field]
    if not isinstance(text, str):
        raise CorpusError(f"{path}:{number}: field {field!r} is {type(text).__name__}, not a string")
    return text.encode("utf-8")


class TokenWriter:
    """Token ids and document starts appended to ``.name.parc-tmp`` files beside ``out``
    and ``index``; ``commit`` renames both into place, ``discard`` removes them."""

    def __init__(self, out: Path, index: Path, dtype: str, buffer: int = BUFFER):
        self.targets = (out, index)
        self.temps = tuple(t.with_name(f".{t.name}.parc-tmp") for t in self.targets)
        self.code = _typecode("H" if dtype == "uint16" else "I", 2 if dtype == "uint16" else 4)
        self.buffer = buffer
        self.tokens = 0
        self.documents = 0
        self.ids = array(self.code)
        self.starts = array(_typecode("Q", 8))
        self.files = [open(t, "wb") for t in self.temps]

    def start_document(self) -> None:
        self.starts.append(self.tokens)
        self.documents += 1
        if len(self.starts) * 8 >= self.buffer * self.ids.itemsize:
            self._flush(self.starts, self.files[1])

    def extend(self, ids) -> None:
        if isinstance(ids, bytes) and sys.byteorder == "little":
            # byte-level ids: each byte widened to the id's size by a strided copy, where
            # array.extend converts one element at a time (about 10 MB/s)
            wide = bytearray(len(ids) * self.ids.itemsize)
            wide[::self.ids.itemsize] = ids
            self.ids.frombytes(wide)
        else:
            self.ids.extend(ids)
        self.tokens += len(ids)
        if len(self.ids) >= self.buffer:
            self._flush(self.ids, self.files[0])

    def commit(self) -> None:
        self._flush(self.ids, self.files[0])
        self._flush(self.starts, self.files[1])
        for stream in self.files:
            stream.close()
        for temp, target in zip(self.temps, self.targets):
            os.replace(temp, target)

    def discard(self) -> None:
        for stream in self.files:
            stream.close()
        for temp in self.temps:
            if temp.exists():
                temp.unlink()

    @staticmethod
    def _flush(values: array, stream) -> None:
        if sys.byteorder != "little":  # the file formats are little-endian everywhere
            values.byteswap()
        stream.write(values.tobytes())
        del values[:]


def _typecode(code: str, size: int) -> str:
    if array(code).itemsize == size:
        return code
    return {"H": "I", "I": "L", "Q": "L"}[code]  # pragma: no cover - exotic platforms
