"""``parc import HF_DIR -o OUT``: a Hugging Face model folder as a parc spec and checkpoint.

Takes: argv's folder and ``-o``. Gives: exit 0 and ``OUT/model.par`` with
``OUT/checkpoint/`` (codegen/hf_import.py); a folder parc cannot import is one line
naming the file and key, exit 1, nothing written; a missing folder, or an ``OUT`` that
exists without ``--force``, exit 2.
"""

from __future__ import annotations

import os
import sys


def run(args) -> int:
    from parc.codegen.hf_import import HfImportError, import_folder

    if not os.path.isdir(args.hf_dir):
        print(f"parc import: {args.hf_dir}: no such folder", file=sys.stderr)
        return 2
    if os.path.lexists(args.out) and not args.force:
        print(f"parc import: {args.out} exists: remove it, or pass --force to replace it", file=sys.stderr)
        return 2
    try:
        out = import_folder(args.hf_dir, args.out, force=args.force)
    except HfImportError as exc:
        print(f"parc import: {args.hf_dir}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the disk filled, a folder vanished while writing
        print(f"parc import: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {os.path.join(out, 'model.par')} and {os.path.join(out, 'checkpoint')}/")
    print(f"next: edit its train block, then parc build {os.path.join(out, 'model.par')} -o BUILD")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "import",
        help="turn a Hugging Face model folder (gpt2, llama, mixtral) into a spec and a checkpoint",
        description=(
            "Read a Hugging Face causal-LM folder (config.json and model.safetensors, or a sharded "
            "model.safetensors.index.json) and write OUT/model.par, a spec of the same model, and "
            "OUT/checkpoint/, its weights as a parc checkpoint (train.py --init-from, or the spec's "
            "train.init, starts from it in any layout)."
        ),
    )
    parser.add_argument("hf_dir", metavar="HF_DIR", help="the folder save_pretrained wrote")
    parser.add_argument("-o", "--out", required=True, metavar="OUT", help="the folder to create")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.set_defaults(func=run)
