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
DCP itself is reached through ``checkpoint_dcp.py``, imported only by the functions
that save or read (Note [DCP on demand]).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import torch
import torch.distributed as dist

from . import checkpoint_shards as shards
from ..train import faults
from .checkpoint_files import (  # noqa: F401 - latest, resolve and read_info are this module's API too
    FORMAT,
    INFO_FILE,
    STEP_DIR,
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


def _rng_state(rank: int, device) -> dict:
    state = {f"rng.cpu.rank{rank}": torch.get_rng_state()}
    if device.type == "cuda":
        state[f"rng.cuda.rank{rank}"] = torch.cuda.get_rng_state(device)
    return state


def _boxes_of(optimizer):
    """The module that lays ``optimizer``'s state out as logical boxes: ``checkpoint_flat``
    under ZeRO (a build ships it only with ZeRO), else ``checkpoint_shards``."""
    if shards.is_zero(optimizer):
        from . import checkpoint_flat

        return checkpoint_flat
    return shards


class Checkpoints:
    """Save every ``every`` steps into ``directory``; resume from a checkpoint."""

    def __init__(
        self, directory, *, every, model, optimizer, tp_group, config, layout, samples_per_step, rank,
        world_size, device, keep=0, loss_scale=None,
    ):
        """``loss_scale``: fp16's ``DynamicLossScale``, saved in and restored from the info file."""
        self.directory, self.every, self.keep = directory, int(every or 0), int(keep or 0)
        self.model, self.optimizer, self.tp_group = model, optimizer, tp_group
        self.config, self.layout, self.samples_per_step = config, layout, samples_per_step
        self.rank, self.world_size, self.device = rank, world_size, device
        self.params = shards.local_parameters(model, tp_group)
        self.boxes = _boxes_of(optimizer)  # lays out the optimizer's state (and ZeRO's parameters)
        self.loss_scale = loss_scale

    def _model_pieces(self, *, saving: bool):
        # under ZeRO checkpoint_flat's: ZeRO-3's shards, or the fp32 master slices under bf16/fp16
        return self.boxes.model_pieces(self.params, saving=saving, optimizer=self.optimizer)

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
        optimizer_step = self.boxes.optimizer_step(self.optimizer)
        pieces = self._model_pieces(saving=True) + shards.buffer_pieces(self.model)
        pieces += self.boxes.optimizer_pieces(self.params, self.optimizer, saving=True)
        state = _rng_state(self.rank, self.device)
        state["optim.step"] = torch.tensor(optimizer_step, dtype=torch.int64)
        from . import checkpoint_dcp  # Note [DCP on demand]

        checkpoint_dcp.save(state, temporary, pieces)
        if self.rank == 0:  # dcp.save returns once .metadata is written: every rank's data is in
            info = dict(
                format=FORMAT, step=step, optimizer_step=optimizer_step, world_size=self.world_size,
                samples_seen=step * self.samples_per_step, layout=self.layout,
                model=dataclasses.asdict(self.config),
            )
            if self.loss_scale is not None:  # the same on every rank: the norm it reads is global
                info["loss_scale"] = self.loss_scale.state_dict()
            with open(os.path.join(temporary, INFO_FILE), "w", encoding="utf-8") as file:
                json.dump(info, file, indent=1, sort_keys=True)
                file.flush()
                os.fsync(file.fileno())
            faults.die_in_save_if_injected(step)  # PARC_FAULT_IN_SAVE (tests only): before the rename
            if os.path.exists(final):  # the same step saved again (after a restart)
                shutil.rmtree(final)
            os.rename(temporary, final)
            self._prune()
            print(f"checkpoint saved: step {step} in {final}", flush=True)
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
        if info.get("weights_only"):  # parc import's: no moments, no step (checkpoint_init.py)
            raise self._refuse(f"{path} holds weights only (parc import): start from it with --init-from {path}")
        optimizer_step = info["optimizer_step"]
        pieces = self._model_pieces(saving=False) + shards.buffer_pieces(self.model)
        if optimizer_step > 0:
            self.boxes.prepare_state(self.optimizer, optimizer_step)
            pieces += self.boxes.optimizer_pieces(self.params, self.optimizer, saving=False)
        self._check_shapes(path, pieces, info)
        same_world = info["world_size"] == self.world_size
        state = {k: torch.empty_like(v) for k, v in _rng_state(self.rank, self.device).items()} if same_world else {}
        from . import checkpoint_dcp  # Note [DCP on demand]

        checkpoint_dcp.load(path, state, pieces)
        self.boxes.loaded(self.optimizer)  # bf16/fp16 parameters: the fp32 masters read, rounded into them
        for key, value in state.items():
            if key.startswith("rng.cpu."):
                torch.set_rng_state(value)
            else:
                torch.cuda.set_rng_state(value, self.device)
        step = info["step"]
        if self.loss_scale is not None and "loss_scale" in info:  # else: the fresh scale
            self.loss_scale.load_state_dict(info["loss_scale"])
        if self.rank == 0:
            note = "" if same_world else f"; saved by {info['world_size']} ranks ({info['layout']}): RNG not restored"
            if info["samples_seen"] != step * self.samples_per_step:
                note += f"; the batch size changed: step {step + 1} reads new samples"
            print(f"resumed from {path} at step {step} (layout {info['layout']}{note})", flush=True)
        return step

    def _check_shapes(self, path: str, pieces, info: dict) -> None:
        """Every tensor this rank reads exists with its full shape, or the run ends naming it."""
        from . import checkpoint_dcp  # Note [DCP on demand]

        saved = checkpoint_dcp.tensor_shapes(path)
        differ = _config_difference(model_config(info, path), self.config)
        for piece in pieces:
            name = piece.name.removeprefix("model.")
            if piece.name not in saved:
                raise self._refuse(f"checkpoint {path} has no tensor {name}: it was saved from a different model{differ}")
            shape = saved[piece.name]
            if shape != piece.full_shape:
                raise self._refuse(
                    f"checkpoint {path}: {name} has shape {shape} there "
                    f"but {piece.full_shape} in this model: it was saved from a different model{differ}"
                )


def _flagged(flag: str, call, path: str):
    """``call(path)``, its ``CheckpointError`` naming the flag the path came from."""
    try:
        return call(path)
    except CheckpointError as exc:
        raise CheckpointError(f"{flag} {exc}") from None


def _config_difference(saved, ours) -> str:
    """``" (hidden 64 there, 128 here)"``: the model settings in which two configs differ."""
    pairs = [(k, getattr(saved, k), getattr(ours, k)) for k in type(ours).__dataclass_fields__]
    differ = [f"{key} {there!r} there, {here!r} here" for key, there, here in pairs if there != here]
    return f" ({'; '.join(differ)})" if differ else ""
