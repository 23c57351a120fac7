"""Sharded, layout-free checkpoints with torch.distributed.checkpoint (DCP).

Takes: this rank's model and optimizer, the tp group, the model config and the
layout. Gives: ``Checkpoints`` — ``restore(resume)`` (the last step a checkpoint
completed, 0 for a fresh start), ``due(step, last)`` and ``save(step)`` — and
``latest(folder)``. What a checkpoint holds, per Note [logical checkpoint tensors]
(checkpoint_shards.py): every parameter and both AdamW moments under logical names
and full shapes, so any layout of the same model loads it; AdamW's step count; the
RNG state of every rank (restored only when the world size is unchanged); and
``parc.json`` (step, samples consumed, the model config, the layout). The learning
rate and the data are pure functions of the step (``optim.lr_at``,
``data.sample_indices``), so the step is their whole state.

Note [atomic checkpoints]: every rank writes into ``DIR/step_000040.tmp/``; DCP's
coordinator writes ``.metadata`` once all ranks' data is written, rank 0 adds
``parc.json``, then renames the folder to ``DIR/step_000040/``. Only names without
``.tmp`` that hold both files count as checkpoints, so a crash at any moment of a
save leaves the previous checkpoint the latest complete one.
Tensors are read back only through DCP (no pickled objects are stored), and a
checkpoint on disk is untrusted input (Note [a checkpoint is untrusted input] in
checkpoint_files.py): every problem with one ends the trainer with one line that rank
0 prints (the folder is shared by all ranks, so every rank finds the same).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    DefaultSavePlanner,
    create_default_local_load_plan,
)
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import _create_write_items, create_read_items_for_chunk_list

from . import checkpoint_shards as shards
from . import faults
from .checkpoint_files import (  # noqa: F401 - latest, resolve and read_info are this module's API too
    FORMAT,
    INFO_FILE,
    STEP_DIR,
    CheckedReader,
    CheckpointError,
    check_folder,
    is_complete,
    latest,
    model_config,
    read_info,
    resolve,
)



def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


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


def _rng_state(rank: int, device) -> dict:
    state = {f"rng.cpu.rank{rank}": torch.get_rng_state()}
    if device.type == "cuda":
        state[f"rng.cuda.rank{rank}"] = torch.cuda.get_rng_state(device)
    return state


class Checkpoints:
    """Save every ``every`` steps into ``directory``; resume from a checkpoint."""

    def __init__(
        self, directory, *, every, model, optimizer, tp_group, config, layout, samples_per_step, rank,
        world_size, device, keep=0,
    ):
        self.directory, self.every, self.keep = directory, int(every or 0), int(keep or 0)
        self.model, self.optimizer, self.tp_group = model, optimizer, tp_group
        self.config, self.layout, self.samples_per_step = config, layout, samples_per_step
        self.rank, self.world_size, self.device = rank, world_size, device
        self.params = shards.local_parameters(model, tp_group)

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def due(self, step: int, last: bool) -> bool:
        """A save after ``step``: every ``every`` steps, and after the last step."""
        if not self.directory:
            return False
        return last or (self.every > 0 and step % self.every == 0)

    def save(self, step: int) -> str:
        """Write the checkpoint of (the end of) ``step`` per Note [atomic checkpoints]."""
        final = os.path.join(self.directory, step_dir_name(step))
        temporary = final + ".tmp"
        if self.rank == 0:
            shutil.rmtree(temporary, ignore_errors=True)  # a crashed save's leftovers
            os.makedirs(temporary)
        self._barrier()
        optimizer_step = shards.optimizer_step(self.optimizer)
        pieces = shards.model_pieces(self.params, saving=True)
        pieces += shards.optimizer_pieces(self.params, self.optimizer, saving=True)
        state = _rng_state(self.rank, self.device)
        state["optim.step"] = torch.tensor(optimizer_step, dtype=torch.int64)
        with _one_process_quiet():
            dcp.save(state, storage_writer=dcp.FileSystemWriter(temporary), planner=_SavePlanner(pieces))
        if self.rank == 0:  # dcp.save returns once .metadata is written: every rank's data is in
            info = dict(
                format=FORMAT, step=step, optimizer_step=optimizer_step, world_size=self.world_size,
                samples_seen=step * self.samples_per_step, layout=self.layout,
                model=dataclasses.asdict(self.config),
            )
            with open(os.path.join(temporary, INFO_FILE), "w", encoding="utf-8") as file:
                json.dump(info, file, indent=1, sort_keys=True)
                file.flush()
                os.fsync(file.fileno())
            faults.die_in_save_if_injected(step)  # PARC_FAULT_IN_SAVE (tests only): before the rename
            if os.path.exists(final):  # the same step saved again (after a restart)
                shutil.rmtree(final)
            os.rename(temporary, final)
            self._prune()
        self._barrier()
        return final

    def _prune(self) -> None:
        """Keep the newest ``keep`` complete checkpoints (0: all); drop crashed saves' leftovers."""
        names = os.listdir(self.directory)
        for name in names:
            if name.endswith(".tmp") and STEP_DIR.match(name[: -len(".tmp")]):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        if self.keep <= 0:
            return
        complete = sorted(n for n in names if STEP_DIR.match(n) and is_complete(os.path.join(self.directory, n)))
        for name in complete[: -self.keep]:
            shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    def _refuse(self, message: str):
        """End the run: rank 0 says why in one line, the other ranks exit 1 quietly."""
        return SystemExit(f"train.py: {message}" if self.rank == 0 else 1)

    def restore(self, resume: str | None, *, restarted: bool = False) -> int:
        """Load ``resume`` (or, after an elastic restart, the directory's latest); the step it ends."""
        try:
            return self._restore(resume, restarted=restarted)
        except CheckpointError as exc:
            raise self._refuse(str(exc)) from None

    def _restore(self, resume: str | None, *, restarted: bool) -> int:
        if self.directory:
            _flagged("--checkpoint-dir", check_folder, self.directory)
        path = None
        if restarted and self.directory:
            path = _flagged("--checkpoint-dir", latest, self.directory)  # maybe newer than --resume
        if path is None and resume:
            path = _flagged("--resume", resolve, resume)
        if path is None:
            existing = _flagged("--checkpoint-dir", latest, self.directory) if self.directory else None
            if existing:  # a fresh start would mix its checkpoints with another run's
                raise self._refuse(
                    f"--checkpoint-dir {self.directory} already holds {existing}: pass "
                    f"--resume {self.directory} to continue from it, or use an empty folder"
                )
            return 0
        info = read_info(path)
        optimizer_step = info["optimizer_step"]
        pieces = shards.model_pieces(self.params, saving=False)
        if optimizer_step > 0:
            shards.prepare_state(self.optimizer, optimizer_step)
            pieces += shards.optimizer_pieces(self.params, self.optimizer, saving=False)
        self._check_shapes(path, pieces, info)
        same_world = info["world_size"] == self.world_size
        state = {k: torch.empty_like(v) for k, v in _rng_state(self.rank, self.device).items()} if same_world else {}
        _load(path, state, _LoadPlanner(pieces))
        for key, value in state.items():
            if key.startswith("rng.cpu."):
                torch.set_rng_state(value)
            else:
                torch.cuda.set_rng_state(value, self.device)
        step = info["step"]
        if self.rank == 0:
            note = "" if same_world else f"; saved by {info['world_size']} ranks ({info['layout']}): RNG not restored"
            if info["samples_seen"] != step * self.samples_per_step:
                note += f"; the batch size changed: step {step + 1} reads new samples"
            print(f"resumed from {path} at step {step} (layout {info['layout']}{note})", flush=True)
        return step

    def _check_shapes(self, path: str, pieces, info: dict) -> None:
        """Every tensor this rank reads exists with its full shape, or the run ends naming it."""
        saved = CheckedReader(path).read_metadata().state_dict_metadata
        differ = _config_difference(model_config(info, path), self.config)
        for piece in pieces:
            name = piece.name.removeprefix("model.")
            if not isinstance(saved.get(piece.name), TensorStorageMetadata):
                raise self._refuse(f"checkpoint {path} has no tensor {name}: it was saved from a different model{differ}")
            shape = tuple(saved[piece.name].size)
            if shape != piece.full_shape:
                raise self._refuse(
                    f"checkpoint {path}: {name} has shape {shape} there "
                    f"but {piece.full_shape} in this model: it was saved from a different model{differ}"
                )


def read_full(path: str, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of checkpoint ``path`` whose name starts with ``prefix``, whole (one process).

    Raises ``CheckpointError`` for a folder that is not a readable checkpoint.
    """
    path = resolve(path)
    saved = CheckedReader(path).read_metadata().state_dict_metadata
    state = {
        name: torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for name, md in sorted(saved.items())
        if name.startswith(prefix) and isinstance(md, TensorStorageMetadata)
    }
    _load(path, state, DefaultLoadPlanner(flatten_state_dict=False))
    return state


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


def _flagged(flag: str, call, path: str):
    """``call(path)``, its ``CheckpointError`` naming the flag the path came from."""
    try:
        return call(path)
    except CheckpointError as exc:
        raise CheckpointError(f"{flag} {exc}") from None


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1][:300] if lines else ''}"


def _config_difference(saved, ours) -> str:
    """``" (hidden 64 there, 128 here)"``: the model settings in which two configs differ."""
    pairs = [(k, getattr(saved, k), getattr(ours, k)) for k in type(ours).__dataclass_fields__]
    differ = [f"{key} {there!r} there, {here!r} here" for key, there, here in pairs if there != here]
    return f" ({'; '.join(differ)})" if differ else ""
