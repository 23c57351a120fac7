"""torch.distributed.checkpoint's side of a checkpoint: planners over boxes, the checked reader.

Takes: boxes of logical tensors (``checkpoint_shards.Piece``) and a checkpoint folder.
Gives: ``save(state, folder, pieces)``, ``load(path, state, pieces)`` and
``tensor_shapes(path)``, each through DCP (a whole checkpoint in one process:
checkpoint_read.py), and ``CheckedReader``, the ``dcp.FileSystemReader`` every read goes through (its index
is read by ``checkpoint_files.read_index``, Note [a checkpoint is untrusted input]).
Before: ``checkpoint.py``, which imports this module only when it saves or reads a
checkpoint (Note [DCP on demand]). After: DCP's own planners and storage layer.

Note [DCP on demand]: importing torch.distributed.checkpoint imports DTensor and its
op tables, about 1.5 s on a CPU, which is a quarter of a short run's start. A trainer
that neither saves nor resumes never needs it, so only this module imports DCP and
``checkpoint.py`` imports this module inside the functions that save or load. The
build ships it with ``checkpoint`` (``features.runtime_modules``).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    DefaultSavePlanner,
    create_default_local_load_plan,
)
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import _create_write_items, create_read_items_for_chunk_list

from .checkpoint_files import CheckpointError, read_index


class CheckedReader(dcp.FileSystemReader):
    """DCP's reader of a checkpoint folder, per Note [a checkpoint is untrusted input]."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        metadata = read_index(str(self.path))
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _by_box(pieces) -> dict:
    boxes = {(p.name, p.offsets): p for p in pieces}
    if len(boxes) != len(pieces):
        raise RuntimeError("internal error in parc (checkpoint): two local boxes of one tensor start together")
    return boxes


class _SavePlanner(DefaultSavePlanner):
    """DCP's planner, plus boxes of logical tensors (``Piece``) as shard write items."""

    def __init__(self, pieces):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.pieces = _by_box(pieces)

    def create_local_plan(self) -> SavePlan:
        items = [item for fqn, obj in self.state_dict.items() for item in _create_write_items(fqn, obj)]
        for piece in self.pieces.values():
            tensor = piece.tensor
            items.append(
                WriteItem(
                    index=MetadataIndex(piece.name, torch.Size(piece.offsets)),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(offsets=torch.Size(piece.offsets), sizes=tensor.size()),
                        properties=TensorProperties.create_from_tensor(tensor),
                        size=torch.Size(piece.full_shape),
                    ),
                )
            )
        self.plan = SavePlan(items)
        return self.plan

    def lookup_object(self, index: MetadataIndex):
        piece = self.pieces.get((index.fqn, tuple(index.offset or ())))
        return piece.tensor if piece is not None else super().lookup_object(index)


class _LoadPlanner(DefaultLoadPlanner):
    """Reads, for each local box, the overlapping parts of whatever boxes were saved."""

    def __init__(self, pieces):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.pieces = _by_box(pieces)

    def create_local_plan(self) -> LoadPlan:
        requests = list(create_default_local_load_plan(self.state_dict, self.metadata, True).items)
        by_name: dict[str, list] = {}
        for piece in self.pieces.values():
            by_name.setdefault(piece.name, []).append(piece)
        for name, pieces in sorted(by_name.items()):
            chunks = [ChunkStorageMetadata(offsets=torch.Size(p.offsets), sizes=p.tensor.size()) for p in pieces]
            requests += create_read_items_for_chunk_list(name, self.metadata.state_dict_metadata[name], chunks)
        return LoadPlan(requests)

    def lookup_tensor(self, index: MetadataIndex):
        piece = self.pieces.get((index.fqn, tuple(index.offset or ())))
        return piece.tensor if piece is not None else super().lookup_tensor(index)


@contextlib.contextmanager
def _one_process_quiet():
    """DCP warns that it runs in one process: that is what ``python train.py`` means."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save(state: dict, folder: str, pieces, *, planner=None) -> None:
    """Write ``state`` and this rank's boxes ``pieces`` into ``folder`` (all ranks together).

    ``planner``: a ``_SavePlanner`` of its own instead, whose tensors are made as DCP asks
    for them (parc import's, Note [import streams]): then each goes into a file of its own,
    since DCP's writer holds every tensor of a file until the file is done."""
    writer = dcp.FileSystemWriter(folder, single_file_per_rank=planner is None)
    with _one_process_quiet():
        dcp.save(state, storage_writer=writer, planner=planner or _SavePlanner(pieces))


def tensor_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """The full shape of every tensor checkpoint ``path`` holds, by its logical name."""
    saved = CheckedReader(path).read_metadata().state_dict_metadata
    return {name: tuple(md.size) for name, md in saved.items() if isinstance(md, TensorStorageMetadata)}


def load(path: str, state: dict, pieces) -> None:
    """Read ``state`` and this rank's boxes ``pieces`` from checkpoint ``path``.

    Two local boxes of one tensor at the same place (a rank holding both copies of a
    tied embedding, or of a stage's two replicas: runtime/layout/placement.py) are read
    once and copied into the others. Boxes starting at the same place may differ in size
    (ZeRO-3 under ZB-V: the two copies' shards are cut from two units of different
    sizes); DCP names a destination by its start, so the one holding the others is read
    and each other is copied from its leading part (one read on every rank: DCP's load
    is collective)."""
    first: dict = {}
    for piece in pieces:
        box = (piece.name, piece.offsets)
        if box not in first or piece.tensor.numel() > first[box].tensor.numel():
            first[box] = piece
    _load(path, state, _LoadPlanner(list(first.values())))
    with torch.no_grad():
        for piece in pieces:
            source = first[(piece.name, piece.offsets)]
            if source is piece:
                continue
            lead = tuple(slice(0, n) for n in piece.tensor.shape)
            if any(n > m for n, m in zip(piece.tensor.shape, source.tensor.shape)):
                raise RuntimeError(f"internal error: two boxes of {piece.name} at {piece.offsets} overlap only in part")
            piece.tensor.copy_(source.tensor[lead])


def _load(path: str, state: dict, planner) -> None:
    """``dcp.load`` through ``CheckedReader``; a damaged checkpoint is a ``CheckpointError``."""
    try:
        with _one_process_quiet():
            dcp.load(state, storage_reader=CheckedReader(path), planner=planner)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - CheckpointException is a BaseException
        cause = exc
        if isinstance(exc, CheckpointException) and exc.failures:  # rank -> (exception, traceback)
            cause = next(iter(exc.failures.values()))
            cause = cause[0] if isinstance(cause, tuple) else cause
        if isinstance(cause, CheckpointError):
            raise cause from None
        raise CheckpointError(f"{path}: cannot read its tensors, the data files are damaged ({_first_line(cause)})") from None


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1][:300] if lines else ''}"
