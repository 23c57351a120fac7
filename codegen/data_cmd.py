"""``parc data prepare``: text files → a flat token file that ``data = tokens(...)`` reads.

Takes: text files. Gives: a ``.bin`` of little-endian uint16 (or uint32) token ids,
nanoGPT style, plus a small ``.json`` beside it saying how it was made. Tokens are
bytes (ids 0–255, always available offline); each document is followed by the
separator id 256 unless ``--no-separator``, so a model over these needs
``vocab >= 257`` (``vocab = 257`` or, to keep shapes round, 512).

A BPE tokenizer is not offered: tiktoken downloads its vocabularies and these
machines have no network. Before: nothing. After: the trainer's ``TokenFile``.
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
    prepare.add_argument("--dtype", choices=("uint16", "uint32"), default="uint16")
    prepare.add_argument(
        "--no-separator", action="store_true", help="do not put id 256 between documents"
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
    documents = []
    for name in args.inputs:
        try:
            documents.append(Path(name).read_bytes())
        except OSError as exc:
            print(f"parc data prepare: cannot read {name}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    out = Path(args.output)
    if out.exists() and not args.force:
        print(
            f"parc data prepare: {out} exists; pass --force to overwrite it", file=sys.stderr
        )
        return 1
    ids = encode_bytes(documents, separator=not args.no_separator, dtype=args.dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as handle:
        ids.tofile(handle)
    os.replace(tmp, out)
    info = {
        "tokenizer": "bytes",
        "dtype": args.dtype,
        "tokens": len(ids),
        "separator": None if args.no_separator else SEPARATOR,
        "min_vocab": 256 if args.no_separator else SEPARATOR + 1,
        "sources": [Path(name).name for name in args.inputs],
    }
    out.with_suffix(".json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}: {len(ids)} tokens ({args.dtype}), vocab >= {info['min_vocab']}")
    return 0
