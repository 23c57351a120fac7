"""Validation loss: the same number in every layout.

Takes: a validation dataset (``data.TokenFile`` of the val file or the held-out tail,
``data.ValidationStream`` for synthetic data), the batch geometry and this rank's
place (dp, cp, pp). Gives: ``eval_only`` (the trainer's ``--eval-only``: a checkpoint's
``val_loss``, printed) and ``Evaluator``, whose ``due(step, last)`` says when to
evaluate and ``run(net)`` returns ``val_loss``: the mean loss of the validation
samples ``0 .. batches·global_batch - 1``, read as training reads a step's samples
(batch b as step b + 1: ``data.sample_indices``), so every layout averages the same
sequences (Note [one meaning of val_loss]).

Note [one meaning of val_loss]: each rank's forward gives the mean token loss of its
micro-batch (over its T/cp tokens under cp; whole on every tp rank; on the last
pipeline stage only). The mean over the rank's micro-batches and batches, brought to
every pipeline rank, then averaged over dp (× cp) is the mean over all
``batches·global_batch`` sequences — what one rank computes — as training's loss is.
Dropout is off while evaluating (``eval()``), and no gradient is kept.
"""

from __future__ import annotations

import contextlib

import torch

from . import data
from ..parallel.data.dp import all_reduce_mean


class Evaluator:
    def __init__(
        self, dataset, *, every, batches, micro_batch, grad_accum, dp_rank, dp_size,
        device, reduce_group=None, cp_rank=0, cp_size=1, cp_kind=None, runner=None, pp_group=None,
        autocast_dtype=None,
    ):
        self.dataset, self.every, self.batches = dataset, every, batches
        self.micro_batch, self.grad_accum = micro_batch, grad_accum
        self.dp_rank, self.dp_size, self.cp_rank, self.cp_size = dp_rank, dp_size, cp_rank, cp_size
        self.cp_kind = cp_kind  # which tokens a cp rank holds (ring: two load-balanced chunks)
        self.device, self.reduce_group = device, reduce_group
        self.runner, self.pp_group, self.autocast_dtype = runner, pp_group, autocast_dtype

    def due(self, step: int, last: bool) -> bool:
        """Every ``every`` steps, and after the last step."""
        return self.every > 0 and (last or step % self.every == 0)

    def micro_batches(self, batch: int) -> list:
        """This rank's micro-batches of validation batch ``batch`` (0-based), as training's."""
        out = []
        for micro in range(self.grad_accum):
            indices = data.sample_indices(
                batch + 1, micro, micro_batch=self.micro_batch, grad_accum=self.grad_accum,
                dp_rank=self.dp_rank, dp_size=self.dp_size,
            )
            # (B, T) token ids each; and the documents' ids under documents = separate (whole under cp)
            inputs, targets, *documents = self.dataset.batch(indices)
            if self.cp_size > 1:
                inputs, targets = data.context_chunk(
                    inputs, targets, cp_rank=self.cp_rank, cp_size=self.cp_size, cp_kind=self.cp_kind
                )
            out.append((inputs, targets, *documents))
        return out

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    @torch.no_grad()
    def run(self, net) -> float:
        """``val_loss`` (collective: every rank calls it at the same step)."""
        modes = [module.training for module in net.modules()]
        net.eval()
        try:
            total = torch.zeros((), dtype=torch.float64, device=self.device)
            for batch in range(self.batches):
                micro_batches = self.micro_batches(batch)
                if self.runner is not None:  # the last stage's mean over micro-batches, 0 elsewhere
                    total += self.runner.evaluate(micro_batches)
                    continue
                for inputs, targets, *documents in micro_batches:
                    with self._autocast():
                        loss = net(inputs.to(self.device), targets.to(self.device), *documents)
                    total += loss.detach().to(torch.float64) / self.grad_accum
            loss = float(total) / self.batches
        finally:
            for module, mode in zip(net.modules(), modes):
                module.training = mode
        if self.pp_group is not None:
            from ..parallel.pipeline.pipeline import loss_over_pipeline

            loss = loss_over_pipeline(loss, self.pp_group)
        return all_reduce_mean(loss, self.reduce_group) if self.reduce_group is not None else loss


def eval_only(evaluator: Evaluator, net, *, resume: str | None, done: int, rank: int) -> float:
    """``--eval-only``: the ``val_loss`` of the checkpoint ``--resume`` read (step ``done``),
    printed by rank 0; the trainer then exits 0 without training. Without ``--resume`` the
    run ends in one line: there is nothing to evaluate but the initialization."""
    if resume is None:
        raise SystemExit(
            "train.py: --eval-only evaluates a checkpoint: pass --resume DIR (a checkpoint, or a "
            "folder of them: its latest)"
        )
    val_loss = evaluator.run(net)  # collective
    if rank == 0:
        print(f"eval-only: checkpoint of step {done} ({resume}): val_loss {val_loss:.6f}", flush=True)
    return val_loss
