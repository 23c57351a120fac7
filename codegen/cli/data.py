"""``parc data prepare``: text files → a flat token file that ``data = tokens(...)`` reads.

Takes: text files. Gives: a ``.bin`` of little-endian uint16 (or uint32) token ids,
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
text), with nothing written; both files are written beside themselves and renamed.
Before: nothing. After: the trainer's ``TokenFile``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from array import array
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
        "--force", action="store_true", help="overwrite OUT.bin if it already exists"
    )
    prepare.set_defaults(func=run_prepare)
    data.set_defaults(func=lambda args: (data.print_help(sys.stderr), 2)[1])


def encode_bytes(documents: list[bytes], *, separator: bool, dtype: str) -> array:
    """Byte-level ids of each document, with the separator between (and after) them."""
    ids = array("H" if dtype == "uint16" else "I")
    if ids.itemsize != (2 if dtype == "uint16" else 4):  # pragma: no cover - exotic platforms
        ids = array("I" if dtype == "uint16" else "L")
    for doc in documents:
        ids.extend(doc)
        if separator:
            ids.append(SEPARATOR)
    if sys.byteorder != "little":  # the file format is little-endian everywhere
        ids.byteswap()
    return ids


def run_prepare(args: argparse.Namespace) -> int:
    from parc.runtime.paths import MissingFile, UnreadableFile, UnwritablePath, check_regular, check_target

    documents = []
    for name in args.inputs:
        try:
            check_regular(name)  # not a folder, a symlink to nothing, /dev/zero
            documents.append(Path(name).read_bytes())
        except MissingFile as exc:
            print(f"parc data prepare: cannot read {exc}", file=sys.stderr)
            return 2
        except UnreadableFile as exc:
            print(f"parc data prepare: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"parc data prepare: cannot read {name}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    out = Path(args.output)
    sidecar = out.with_suffix(".json")
    if sidecar == out:
        print(f"parc data prepare: {out}: name the token file OUT.bin (its .json is written beside it)",
              file=sys.stderr)
        return 1
    for target in (out, sidecar):
        try:
            check_target(target, folder=False)
        except UnwritablePath as exc:
            print(f"parc data prepare: {exc}", file=sys.stderr)
            return 1
        if target.exists() and not args.force:
            print(f"parc data prepare: {target} exists; pass --force to overwrite it", file=sys.stderr)
            return 1
    if args.tokenizer is not None:
        from ..tokenize_files import TokenizerError, encode_with_tokenizer

        try:
            ids, info = encode_with_tokenizer(
                documents, args.tokenizer, eot=args.eot, separator=not args.no_separator, dtype=args.dtype
            )
        except TokenizerError as exc:
            print(f"parc data prepare: {exc}", file=sys.stderr)
            return exc.status
    else:
        dtype = args.dtype or "uint16"
        ids = encode_bytes(documents, separator=not args.no_separator, dtype=dtype)
        info = {
            "tokenizer": "bytes",
            "dtype": dtype,
            "tokens": len(ids),
            "separator": None if args.no_separator else SEPARATOR,
            "min_vocab": 256 if args.no_separator else SEPARATOR + 1,
        }
    info["sources"] = [Path(name).name for name in args.inputs]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(out, ids.tobytes())
        _write_atomically(sidecar, (json.dumps(info, indent=2, sort_keys=True) + "\n").encode())
    except OSError as exc:  # the disk filled: nothing half-written is left behind
        print(f"parc data prepare: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}: {len(ids)} tokens ({info['dtype']}), vocab >= {info['min_vocab']}")
    return 0


def _write_atomically(target: Path, data: bytes) -> None:
    """``data`` into ``target`` through a temporary file beside it, renamed into place."""
    tmp = target.with_name(f".{target.name}.parc-tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
