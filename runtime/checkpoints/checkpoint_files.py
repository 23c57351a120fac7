"""A checkpoint folder on disk, read as untrusted input: its ``parc.json``, its DCP index.

Takes: a path a user named (``--resume DIR``, ``--checkpoint-dir DIR``, ``parc export
CKPT``). Gives: ``latest(folder)`` and ``resolve(path)`` (the checkpoint meant),
``read_info(path)`` (``parc.json``, checked field by field), ``check_folder`` (a
``--checkpoint-dir`` the trainer can write into) and ``read_index``, the DCP index
as ``checkpoint_dcp.CheckedReader`` (every load's reader) gets it; each problem is a
``CheckpointError`` whose message names the file and what is wrong (``NoCheckpoint``
when there is none at all). Before: the
trainer's flags. After: ``checkpoint.py`` and ``checkpoint_dcp.py`` (loads and saves),
``parc export``.

Note [a checkpoint is untrusted input]: a checkpoint can come from anywhere (a shared
folder, a download). DCP's index ``.metadata`` is a pickle, which can run any code
as it loads, so it is unpickled here with an allow-list of the classes DCP writes
(its metadata dataclasses, ``torch.Size``, dtypes and layouts); every data file it
names must stay inside the checkpoint (``paths.inside``), as must each ``step_*``
entry of a folder of checkpoints and the ``parc.json``/``.metadata`` files
themselves. Tensors are read by DCP with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import dataclasses

import io
import os
import pickle
import re

import torch

from ..models.model import ModelConfig
from ..paths import UnreadableFile, UnsafePath, UnwritablePath, check_target, inside, json_path, read_json, read_limited

FORMAT = 1
STEP_DIR = re.compile(r"^step_([0-9]{6,})$")
INFO_FILE = "parc.json"
INDEX_FILE = ".metadata"
INDEX_LIMIT = 1 << 30
"""The most bytes of a DCP index read (about a hundred bytes per tensor box)."""

INFO_FIELDS = {  # key -> (type, least value)
    "format": (int, 1),
    "step": (int, 0),
    "optimizer_step": (int, 0),
    "world_size": (int, 1),
    "samples_seen": (int, 0),
    "layout": (str, None),
    "model": (dict, None),
}
"""What ``parc.json`` must hold (``Checkpoints.save`` writes it)."""


class CheckpointError(ValueError):
    """A checkpoint (or folder of them) that cannot be read or written; the message says why."""


class NoCheckpoint(CheckpointError):
    """Nothing at the path, or no complete checkpoint in the folder (a CLI's exit 2)."""


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, INDEX_FILE)) and os.path.isfile(os.path.join(path, INFO_FILE))


def latest(folder: str) -> str | None:
    """The complete checkpoint of ``folder`` with the highest step, or None.

    A ``step_*`` entry that leads outside ``folder`` is a ``CheckpointError``, never skipped
    (Note [a checkpoint is untrusted input]).
    """
    if not os.path.isdir(folder):
        return None
    found = []
    for name in os.listdir(folder):
        match = STEP_DIR.match(name)
        if not match:
            continue
        try:
            inside(folder, name)
        except UnsafePath as exc:
            raise CheckpointError(f"{folder}: {exc}: not reading it") from None
        if is_complete(os.path.join(folder, name)):
            found.append((int(match.group(1)), name))
    return os.path.join(folder, max(found)[1]) if found else None


def resolve(path: str) -> str:
    """A checkpoint folder, or a folder of checkpoints meaning its latest complete one."""
    if os.path.islink(path) and not os.path.exists(path):
        raise CheckpointError(f"{path} is a symlink to nothing ({os.readlink(path)})")
    if not os.path.exists(path):
        raise NoCheckpoint(f"{path}: no such folder")
    if not os.path.isdir(path):
        raise CheckpointError(f"{path} is a file, not a checkpoint folder")
    if is_complete(path):
        return path
    found = latest(path)
    if found is None:
        raise NoCheckpoint(f"{path}: no complete checkpoint there (step_NNNNNN/ with .metadata and parc.json)")
    return found


def check_folder(folder: str) -> None:
    """``folder`` is (or can become) a folder the trainer saves checkpoints into."""
    try:
        check_target(folder, folder=True)
    except UnwritablePath as exc:
        raise CheckpointError(str(exc)) from None


def read_info(path: str) -> dict:
    """``parc.json`` of checkpoint ``path``, every field checked (``INFO_FIELDS``, the model config)."""
    try:
        info = read_json(inside(path, INFO_FILE))
    except (UnreadableFile, UnsafePath) as exc:
        raise CheckpointError(f"{path}: {exc}" if isinstance(exc, UnsafePath) else str(exc)) from None
    where = os.path.join(path, INFO_FILE)
    if not isinstance(info, dict):
        raise CheckpointError(f"{where}: must be an object, not {type(info).__name__}")
    for key, (kind, least) in INFO_FIELDS.items():
        _check_field(where, info, key, kind, least)
    if info["format"] != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {info['format']!r}, expected {FORMAT}")
    model_config(info, where)
    return info


def model_config(info: dict, where: str) -> ModelConfig:
    """The ``ModelConfig`` of a checkpoint's ``parc.json`` (checked by ``read_info``)."""
    model = info["model"]
    for field in ModelConfig.__dataclass_fields__.values():
        optional = str(field.type).endswith(" | None")  # expert_ffn, capacity_factor: None allowed
        kind = {"int": int, "float": float, "bool": bool, "str": str}[str(field.type).removesuffix(" | None")]
        if field.name not in model and field.default is not dataclasses.MISSING:
            continue  # a field newer than the checkpoint (the MoE ones): its default, a dense model
        if optional and model.get(field.name, 0) is None:
            continue
        least = (0 if field.default == 0 else 1) if kind is int else None  # experts, shared_experts: 0 = none
        _check_field(where, model, field.name, kind, least, parent=("model",))
    try:
        return ModelConfig(**{key: model[key] for key in ModelConfig.__dataclass_fields__ if key in model})
    except ValueError as exc:
        raise CheckpointError(f"{where}: [\"model\"]: {exc}") from None


KIND_WORDS = {int: "a whole number", float: "a number", str: "a string", bool: "true or false", dict: "an object"}


def _check_field(where, document, key, kind, least, parent=()) -> None:
    place = json_path((*parent, key))
    if key not in document:
        raise CheckpointError(f"{where}: {place} is missing")
    value = document[key]
    ok = isinstance(value, (int, float) if kind is float else kind) and not (kind is not bool and isinstance(value, bool))
    if not ok:
        raise CheckpointError(f"{where}: {place}: must be {KIND_WORDS[kind]}, not {value!r:.40}")
    if least is not None and value < least:
        raise CheckpointError(f"{where}: {place}: must be >= {least}, not {value!r}")


# ---- the DCP index ---------------------------------------------------------------


def _allowed(module: str, name: str) -> bool:
    if module == "torch.distributed.checkpoint.metadata":
        return name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties",
                        "ChunkStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
    if module == "torch":
        return name == "Size" or isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format))
    return (module, name) in {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("collections", "OrderedDict"),
    }


class _IndexUnpickler(pickle.Unpickler):
    """Unpickles only what DCP's index holds (Note [a checkpoint is untrusted input])."""

    def find_class(self, module, name):
        if not _allowed(module, name):
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a DCP index never holds")
        return super().find_class(module, name)


def read_index(folder: str):
    """The ``Metadata`` of checkpoint ``folder``'s DCP index, per Note [a checkpoint is untrusted input].

    DCP is imported here, not at module level (Note [DCP on demand] in checkpoint_dcp.py).
    """
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    try:
        index = inside(folder, INDEX_FILE)
        data = read_limited(index, limit=INDEX_LIMIT)
        metadata = _IndexUnpickler(io.BytesIO(data)).load()
    except (UnsafePath, UnreadableFile) as exc:
        raise CheckpointError(f"{folder}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any byte string: a damaged index
        raise CheckpointError(f"{folder}/{INDEX_FILE} is not a DCP index: {type(exc).__name__}: {exc}") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise CheckpointError(f"{folder}/{INDEX_FILE} is not a DCP index")
    for item in metadata.storage_data.values():
        try:
            inside(folder, getattr(item, "relative_path", None))
        except UnsafePath as exc:
            raise CheckpointError(f"{folder}/{INDEX_FILE} names a data file outside the checkpoint: {exc}") from None
    if getattr(metadata, "storage_meta", None) is None:  # as DCP's own reader does
        metadata.storage_meta = StorageMeta()
    return metadata
