"""``parc export CKPT --to safetensors OUT``: a checkpoint's full weights under Hugging Face names.

Takes: a checkpoint folder written by a generated trainer (or a folder of them: its
latest complete one), read through torch.distributed.checkpoint in one process, and
its ``parc.json`` (the model config). Gives: ``OUT`` — a ``.safetensors`` file, or a
folder holding ``model.safetensors`` and a Hugging Face ``config.json`` — with the
vocab padding rows dropped and the names and layouts of ``transformers``' GPT2LMHeadModel
(gpt), LlamaForCausalLM (llama) or MixtralForCausalLM (llama with experts);
``hf_state_dict`` is the conversion itself. A bad
checkpoint (``runtime/checkpoints/checkpoint_files.py``) or an OUT that cannot be written is one
line, exit 1, with nothing written; an existing export is replaced only with ``--force``.

The names, layouts and config keys are codegen/hf_names.py's (Note [Hugging Face layouts],
Note [Mixtral names], Note [Mixtral's aux loss]), the table ``parc import`` reads the other
way. A model trained with ``capacity_factor`` (each expert dropped the tokens past its
capacity: Mixtral, computing every token, would be another model) is an ``ExportError``
unless ``--as-dropless`` asks for it anyway, with a warning.

``--spec SPEC`` (the spec the model was trained from): when its data names a tokenizer —
the record ``parc data prepare --tokenizer`` wrote beside the token file (``X.json``,
its ``tokenizer``) — that file, found beside the token file (or given as ``--tokenizer
FILE``), is copied beside the export as ``tokenizer.json``, so OUT loads with
``transformers`` as model and tokenizer (``tokenizer_file``); ``config.json``'s
``eos_token_id`` is then the record's separator. A spec whose data names none (synthetic
data, bytes) copies nothing and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import TYPE_CHECKING

from parc.codegen import hf_names

if TYPE_CHECKING:  # annotations only: torch loads when exporting
    import torch


class ExportError(Exception):
    pass


def hf_state_dict(weights: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """parc's full weights (logical names, padded vocab) → Hugging Face's, per Note [Hugging Face layouts]."""
    try:
        links = hf_names.links(config)
    except hf_names.NoHfNames as exc:
        raise ExportError(str(exc)) from None
    out = {}
    for link in links:
        tensors = hf_names.to_hf(link, [weights[name] for name in link.parc], config["vocab"])
        out.update(zip(link.hf, tensors))
    return {name: tensor.contiguous().clone() for name, tensor in out.items()}


NO_SPECIAL_TOKENS = {"bos_token_id": None, "eos_token_id": None}
"""A parc model has no tokenizer, so no begin/end-of-text ids: written as null, else
transformers takes its own defaults (gpt2: 50256, outside a small vocabulary, with a
warning on every load; llama: 1 and 2, ids that mean nothing here)."""


def hf_config(config: dict) -> dict:
    """A ``config.json`` for transformers with the same model."""
    try:
        return hf_names.hf_config(config) | NO_SPECIAL_TOKENS
    except hf_names.NoHfNames as exc:
        raise ExportError(str(exc)) from None


def check_out(out: str, *, force: bool) -> None:
    """``OUT`` can be written; an export already there is overwritten only with ``--force``.

    ``ExportError`` otherwise: never a user's file silently replaced, never a write through a
    symlink to nothing, into a device (``/dev/null``), under a file or into a read-only folder.
    """
    from parc.runtime.paths import UnwritablePath, check_target

    folder = not out.endswith(".safetensors")
    try:
        check_target(out, folder=folder)
    except UnwritablePath as exc:
        raise ExportError(str(exc)) from None
    existing = [os.path.join(out, name) for name in FOLDER_FILES] if folder else [out]
    for path in existing:
        try:
            check_target(path, folder=False)  # a folder named model.safetensors, a symlink to nothing
        except UnwritablePath as exc:
            raise ExportError(str(exc)) from None
        if os.path.exists(path) and not force:
            raise ExportError(f"{path} exists: remove it, or pass --force to overwrite it")


FOLDER_FILES = ("model.safetensors", "config.json")
"""What an export into a folder writes (other files there are left alone)."""


def dropped_tokens(config: dict) -> str | None:
    """Why Mixtral would compute another model than the one trained: the capacity that
    dropped tokens (Note [Mixtral names]); None for a dropless or dense model."""
    capacity = config.get("capacity_factor")
    if not config.get("experts", 0) or capacity is None:
        return None
    return (f"the model was trained with capacity_factor = {capacity:g} (each expert dropped the tokens "
            "past its capacity), but Mixtral drops none: the export would compute another model")


def spec_tokenizer(spec_path: str) -> tuple[str, dict] | None:
    """The tokenizer file the spec's data names, with its token file's record: the record
    (``X.json`` beside the token file) names it, and it is looked for beside the token file.
    None when the data names no tokenizer (synthetic data, byte tokens, no record)."""
    from parc.dsl import Diagnostics, load
    from parc.dsl.data_files import token_records

    try:
        spec = load(spec_path)
    except Diagnostics as exc:
        raise ExportError(f"--spec {spec_path}: {len(exc.errors)} error(s): run parc check {spec_path}") from None
    for written, record in token_records(spec):
        name = record.get("tokenizer") if record else None
        if not isinstance(name, str) or name in ("", "bytes"):
            continue
        path = os.path.join(os.path.dirname(spec.resolve(written)), os.path.basename(name))
        if not os.path.isfile(path):
            raise ExportError(f"the record of {written} names the tokenizer {name}, which is not beside it "
                              f"({path}): pass --tokenizer FILE")
        return path, record
    return None


def tokenizer_target(tokenizer: str, out: str, *, force: bool) -> str:
    """Where ``tokenizer`` goes: ``tokenizer.json`` beside the export (in OUT, or beside
    OUT.safetensors), checked before anything is written."""
    from parc.runtime.paths import UnreadableFile, UnwritablePath, check_regular, check_target

    folder = out if not out.endswith(".safetensors") else os.path.dirname(os.path.abspath(out))
    target = os.path.join(folder, "tokenizer.json")
    try:
        check_regular(tokenizer)
        check_target(target, folder=False)
    except (UnreadableFile, UnwritablePath) as exc:
        raise ExportError(str(exc)) from None
    if os.path.exists(target) and not force:
        raise ExportError(f"{target} exists: remove it, or pass --force to overwrite it")
    return target


def export(ckpt: str, out: str, *, force: bool = False, as_dropless: bool = False,
           tokenizer: str | None = None, eos: int | None = None) -> str:
    """Write the export of checkpoint ``ckpt`` to ``out``; the safetensors file written.

    Nothing is written until the checkpoint has been read; each file is written beside
    its place and renamed into it. ``as_dropless``: export a model trained with a capacity
    anyway (``dropped_tokens``); else that is an ``ExportError``. ``tokenizer``: a file
    copied beside the export as ``tokenizer.json`` (``eos``: its end-of-text id, for
    config.json).
    """
    from parc.runtime.checkpoints import checkpoint, checkpoint_read  # torch, only when exporting

    from safetensors.torch import save_file

    check_out(out, force=force)
    copy_to = tokenizer_target(tokenizer, out, force=force) if tokenizer else None
    path = checkpoint.resolve(ckpt)
    info = checkpoint.read_info(path)
    if drops := dropped_tokens(info["model"]):
        if not as_dropless:
            raise ExportError(f"{path}: {drops}; pass --as-dropless to export it as a dropless Mixtral anyway")
        print(f"parc export: warning: {drops} (--as-dropless)", file=sys.stderr)
    weights = {name[len("model."):]: t for name, t in checkpoint_read.read_full(path, "model.").items()}
    try:
        tensors = hf_state_dict(weights, info["model"])
    except KeyError as exc:
        raise ExportError(f"{path} has no tensor {exc.args[0]}, which its parc.json's model needs") from None
    except ExportError as exc:
        raise ExportError(f"{path}: {exc}") from None
    metadata = {"format": "pt", "parc_step": str(info["step"]), "parc_layout": info["layout"]}
    folder = not out.endswith(".safetensors")
    target = os.path.join(out, "model.safetensors") if folder else out
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    temporary = os.path.join(os.path.dirname(os.path.abspath(target)), f".{os.path.basename(target)}.parc-tmp")
    save_file(tensors, temporary, metadata=metadata)
    os.chmod(temporary, 0o666 & ~_umask())  # safetensors makes it 0600; config.json has the umask's mode
    os.replace(temporary, target)
    if folder:
        config = os.path.join(out, "config.json")
        with open(config + ".parc-tmp", "w", encoding="utf-8") as file:
            special = {"eos_token_id": eos} if tokenizer and isinstance(eos, int) else {}
            json.dump(hf_config(info["model"]) | special, file, indent=2, sort_keys=True)
            file.write("\n")
        os.replace(config + ".parc-tmp", config)
    if copy_to is not None:
        shutil.copyfile(tokenizer, copy_to + ".parc-tmp")
        os.replace(copy_to + ".parc-tmp", copy_to)
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def run(args) -> int:
    from parc.runtime.checkpoints.checkpoint_files import CheckpointError, NoCheckpoint

    if args.to != "safetensors":
        print(f"parc export: unknown format {args.to!r}: safetensors", file=sys.stderr)
        return 2
    if not os.path.exists(args.checkpoint) and not os.path.islink(args.checkpoint):
        print(f"parc export: {args.checkpoint}: no such checkpoint folder", file=sys.stderr)
        return 2
    try:
        tokenizer, eos = args.tokenizer, None
        if tokenizer is None and args.spec is not None:
            found = spec_tokenizer(args.spec)
            if found is None:
                print(f"parc export: {args.spec}'s data names no tokenizer: none copied")
            else:
                tokenizer, eos = found[0], found[1].get("separator")
        target = export(args.checkpoint, args.out, force=args.force, as_dropless=args.as_dropless,
                        tokenizer=tokenizer, eos=eos)
    except (ExportError, CheckpointError) as exc:
        print(f"parc export: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, NoCheckpoint) else 1
    except OSError as exc:  # the disk filled, the folder vanished while writing
        print(f"parc export: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {target}" + (" and tokenizer.json beside it" if tokenizer else ""))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a checkpoint's weights as safetensors with Hugging Face names",
        description=(
            "Gather the full weights of a checkpoint (any layout) into a safetensors file with "
            "Hugging Face's names for gpt2, llama (Qwen2, Qwen3) or Mixtral, vocab padding dropped (parc import reads "
            "them back). OUT ending in "
            ".safetensors is that file; otherwise a folder with model.safetensors and config.json."
        ),
    )
    parser.add_argument("checkpoint", metavar="CKPT", help="a checkpoint folder, or a folder of them (its latest)")
    parser.add_argument("--to", required=True, choices=["safetensors"], help="output format")
    parser.add_argument("out", metavar="OUT")
    parser.add_argument("--force", action="store_true", help="overwrite an export already at OUT")
    parser.add_argument("--as-dropless", action="store_true",
                        help="export a mixture of experts trained with capacity_factor as Mixtral, which drops "
                        "no tokens (a different model: warned)")
    parser.add_argument("--spec", metavar="SPEC", default=None,
                        help="the spec the model was trained from: the tokenizer its data names (parc data "
                        "prepare --tokenizer's record beside the token file) is copied beside OUT")
    parser.add_argument("--tokenizer", metavar="FILE", default=None,
                        help="a tokenizer.json to copy beside OUT (instead of the one --spec names)")
    parser.set_defaults(func=run)
