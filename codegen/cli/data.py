"""``parc data prepare``: text files → a flat token file that ``data = tokens(...)`` reads.

Takes: text files, JSON Lines files (``.jsonl``/``.json``: each line's ``--field``,
default ``text``, is a document) or folders of them (``codegen/corpus.py`` says which
files count). It streams: memory is bounded by ``--buffer`` whatever the input's size,
with progress on stderr when it is a terminal (or with ``--progress``). Gives: a
``.bin`` of little-endian uint16 (or uint32) token ids,
nanoGPT style, plus a small ``.json`` beside it saying how it was made. Tokens are
bytes (ids 0–255, always available offline); each document is followed by the
separator id 256 unless ``--no-separator``, so a model over these needs
``vocab >= 257`` (``vocab = 257`` or, to keep shapes round, 512).

With ``--tokenizer tokenizer.json`` the ids are a Hugging Face ``tokenizers`` file's
instead (offline: a local file; ``codegen/tokenize_files.py``): documents are separated
by the tokenizer's end-of-text id, the dtype is uint32 when an id passes 65,535, and the
record says the vocabulary size, so a spec with a smaller ``vocab`` is refused (PAR0120).
A text that is not a readable file, or an output that
exists (without ``--force``) or cannot be written, is one line, exit 1 (2 for a missing
text), with nothing written; a JSON line that is not JSON or lacks the field names
its file:line. All three files (``.bin``, ``.json``, and ``.idx``: each document's first
token offset, uint64) are written beside themselves and renamed.
Before: nothing. After: the trainer's ``TokenFile``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

SEPARATOR = 256


def register(subparsers) -> None:
    data = subparsers.add_parser("data", help="prepare training data")
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION")
    prepare = data_sub.add_parser(
        "prepare",
        help="turn text files into a token file for data = tokens(...)",
        description=__doc__.split("\n\n")[1],
    )
    prepare.add_argument("inputs", nargs="+", metavar="TEXT", help="UTF-8 (or any) text files")
    prepare.add_argument("-o", "--output", required=True, metavar="OUT.bin")
    prepare.add_argument(
        "--dtype", choices=("uint16", "uint32"), default=None,
        help="element type (default uint16; with --tokenizer, uint32 when an id passes 65,535)",
    )
    prepare.add_argument(
        "--tokenizer", metavar="tokenizer.json", default=None,
        help="a Hugging Face tokenizers file (local); without it, tokens are bytes",
    )
    prepare.add_argument(
        "--eot", metavar="TOKEN", default=None,
        help="with --tokenizer: the end-of-text token between documents (default: the "
        "tokenizer's own, e.g. <|endoftext|> or </s>)",
    )
    prepare.add_argument(
        "--no-separator", action="store_true",
        help="do not put the separator (id 256, or the tokenizer's end-of-text) between documents",
    )
    prepare.add_argument(
        "--field", default="text", metavar="NAME",
        help="in a .jsonl/.json file (JSON Lines), the field that holds each document's text (default: text)",
    )
    prepare.add_argument(
        "--progress", action="store_true",
        help="show bytes done, documents and rate on stderr (the default when stderr is a terminal)",
    )
    prepare.add_argument(
        "--buffer", type=_positive, default=None, metavar="TOKENS",
        help="tokens (and bytes of text) held in memory before a write (default 1,048,576)",
    )
    prepare.add_argument(
        "--force", action="store_true", help="overwrite OUT.bin if it already exists"
    )
    prepare.set_defaults(func=run_prepare)
    data.set_defaults(func=lambda args: (data.print_help(sys.stderr), 2)[1])


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("a positive number of tokens")
    return value


def run_prepare(args: argparse.Namespace) -> int:
    from parc.runtime.paths import UnwritablePath, check_target

    from ..corpus import CorpusError, expand

    try:
        sources = expand(args.inputs)
    except CorpusError as exc:
        print(f"parc data prepare: {exc}", file=sys.stderr)
        return exc.status
    out = Path(args.output)
    sidecar, index = out.with_suffix(".json"), out.with_suffix(".idx")
    if out in (sidecar, index):
        print(f"parc data prepare: {out}: name the token file OUT.bin (its .json and .idx are written beside it)",
              file=sys.stderr)
        return 1
    for target in (out, sidecar, index):
        try:
            check_target(target, folder=False)
        except UnwritablePath as exc:
            print(f"parc data prepare: {exc}", file=sys.stderr)
            return 1
        if target.exists() and not args.force:
            print(f"parc data prepare: {target} exists; pass --force to overwrite it", file=sys.stderr)
            return 1
    if args.tokenizer is not None:
        from ..tokenize_files import TokenizerEncoder, TokenizerError

        try:
            encoder = TokenizerEncoder(args.tokenizer, eot=args.eot, separator=not args.no_separator, dtype=args.dtype)
        except TokenizerError as exc:
            print(f"parc data prepare: {exc}", file=sys.stderr)
            return exc.status
    else:
        encoder = ByteEncoder(args.dtype or "uint16", separator=not args.no_separator)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        info = _stream(sources, encoder, out, index, args)
        info["sources"] = [path.name for path in sources.files]
        _write_atomically(sidecar, (json.dumps(info, indent=2, sort_keys=True) + "\n").encode())
    except CorpusError as exc:
        print(f"parc data prepare: {exc}", file=sys.stderr)
        return exc.status
    except OSError as exc:  # the disk filled: nothing half-written is left behind
        print(f"parc data prepare: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    skipped = f" ({sources.skipped} other files skipped)" if sources.skipped else ""
    print(f"wrote {out}: {info['tokens']} tokens ({info['dtype']}), vocab >= {info['min_vocab']}{skipped}")
    return 0


class ByteEncoder:
    """Byte-level ids (0–255), the separator 256 between documents."""

    def __init__(self, dtype: str, *, separator: bool):
        self.dtype = dtype
        self.separator_id = SEPARATOR if separator else None

    def encode(self, piece: bytes) -> bytes:
        return piece  # an array of uint16/uint32 extends from bytes one id per byte

    def info(self, tokens: int) -> dict:
        return {
            "tokenizer": "bytes",
            "dtype": self.dtype,
            "tokens": tokens,
            "separator": self.separator_id,
            "min_vocab": 256 if self.separator_id is None else SEPARATOR + 1,
        }


def _stream(sources, encoder, out: Path, index: Path, args: argparse.Namespace) -> dict:
    """Every document through ``encoder`` into a ``TokenWriter``; the record to write."""
    from ..corpus import BUFFER, TokenWriter, documents

    buffer = args.buffer or BUFFER
    writer = TokenWriter(out, index, encoder.dtype, buffer)
    progress = Progress(sources.size, shown=args.progress or sys.stderr.isatty())
    try:
        for path in sources.files:
            for document in documents(path, field=args.field, buffer=buffer,
                                      whole_lines=not isinstance(encoder, ByteEncoder)):
                writer.start_document()
                for piece in document:
                    writer.extend(encoder.encode(piece))
                    progress.advance(len(piece), writer.documents)
                if encoder.separator_id is not None:
                    writer.extend((encoder.separator_id,))
            progress.file_done(path.stat().st_size, writer.documents)
        writer.commit()
    except BaseException:
        writer.discard()
        raise
    finally:
        progress.close()
    return encoder.info(writer.tokens)


class Progress:
    """``12.0 MB of 96.0 MB, 3,021 documents, 40.1 MB/s`` on one stderr line, at most
    twice a second; silent unless ``shown``."""

    def __init__(self, total: int, *, shown: bool):
        self.total, self.shown = total, shown
        self.done = self.finished = 0
        self.began = self.last = time.monotonic()

    def advance(self, size: int, documents: int) -> None:
        self.done += size
        now = time.monotonic()
        if self.shown and now - self.last >= 0.5:
            self.last = now
            self._show(documents, now)

    def file_done(self, size: int, documents: int) -> None:
        self.finished += size
        self.done = self.finished  # a JSON line's bytes are counted at its file's end
        if self.shown:
            self._show(documents, time.monotonic())

    def _show(self, documents: int, now: float) -> None:
        rate = self.done / max(now - self.began, 1e-9) / 1e6
        print(f"\r{self.done / 1e6:.1f} MB of {self.total / 1e6:.1f} MB, {documents:,} documents, {rate:.1f} MB/s",
              end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr)


def _write_atomically(target: Path, data: bytes) -> None:
    """``data`` into ``target`` through a temporary file beside it, renamed into place."""
    tmp = target.with_name(f".{target.name}.parc-tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
