"""What each training step logs: loss, grad norm, lr, tokens/s, MFU, memory, time.

Takes: the model config and per-step figures (``exposed_comm_s``: seconds blocked on
communication, from ``comm.exposed_clock``, Note [exposed communication]). Gives: ``flops_per_token``,
``peak_mem_bytes`` and ``MetricsLogger`` (one line per step on rank 0, and one JSON
object per step in ``--metrics-jsonl``).
"""

from __future__ import annotations

import json
import os
import resource
import sys

import torch

from ..layout.model_desc import describe
from ..paths import UnwritablePath, check_target


def flops_per_token(config) -> float:
    """Model FLOPs per token of training (PaLM's): 6·N + 12·L·H·Q·T.

    N counts the weights that take part in a matmul: the blocks' projections and the
    output head (vocab·hidden, tied or not, as nanoGPT counts it), not the embedding
    lookups, norms or biases. L layers, H heads, Q head dim, T sequence length.
    ``model_desc.ModelDesc.flops_per_token`` counts it; the planner asks the same.
    """
    return describe(config).flops_per_token()


def _open_log(path: str):
    """``--metrics-jsonl PATH`` opened to append (before training), or the run ends in one line."""
    if os.path.isdir(path) or not os.path.exists(path):
        try:
            check_target(path, folder=False)  # a folder, a symlink to nothing, a path under a file
        except UnwritablePath as exc:
            raise SystemExit(f"train.py: --metrics-jsonl {exc}") from None
    try:
        return open(path, "a", encoding="utf-8")  # appending to /dev/null or a pipe is fine
    except OSError as exc:
        raise SystemExit(f"train.py: --metrics-jsonl {path}: {exc.strerror or exc}") from None


def peak_mem_bytes(device) -> int:
    """CUDA: peak allocated bytes. CPU: the process's peak resident set."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class MetricsLogger:
    """Rank 0's step records: a line on stdout, a JSON line in ``--metrics-jsonl`` and,
    with ``tensorboard`` (a folder), TensorBoard scalars (``observe.TensorBoard``)."""

    def __init__(self, path, *, enabled: bool, tensorboard: str | None = None):
        self.enabled = enabled
        self.file = _open_log(path) if (enabled and path) else None
        self.board = None
        if enabled and tensorboard:
            from .observe import TensorBoard  # Note [tensorboard on demand]

            self.board = TensorBoard(tensorboard)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        mfu, exposed = record.get("mfu"), record.get("exposed_comm_s")
        predicted = record.get("predicted_step_time_s")  # builds of `auto` specs
        val_loss = record.get("val_loss")  # steps that evaluated (train.eval)
        print(
            f"step {record['step']:>5} | loss {record['loss']:.4f} | grad_norm {record['grad_norm']:.3f}"
            f" | lr {record['lr']:.2e} | {record['tokens_per_s']:,.0f} tok/s"
            f" | mfu {'n/a' if mfu is None else f'{100 * mfu:.1f}%'}"
            f" | mem {record['peak_mem_bytes'] / 2**20:,.0f} MiB | {record['step_time_s']:.3f} s"
            + ("" if exposed is None else f" (comm exposed {exposed:.3f} s)")
            + ("" if predicted is None else f" | predicted {predicted:.3f} s")
            + ("" if val_loss is None else f" | val_loss {val_loss:.4f}"),
            flush=True,
        )
        if self.file:
            self.file.write(json.dumps(record, sort_keys=True) + "\n")
            self.file.flush()
        if self.board:
            self.board.log(record)

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
        if self.board:
            self.board.close()
            self.board = None


# Note [tensorboard on demand]: the generated trainer needs only torch; the
# ``tensorboard`` package is imported when a run asks for it (--tensorboard DIR or
# ``train.log = tensorboard(dir)``), and its absence is then one line, not a traceback.
