"""What each training step logs: loss, grad norm, lr, tokens/s, MFU, memory, time.

Takes: the model config and per-step figures (``exposed_comm_s``: seconds blocked on
communication, from ``comm.exposed_clock``, Note [exposed communication]). Gives: ``flops_per_token``,
``peak_mem_bytes`` and ``MetricsLogger`` (one line per step on rank 0, with the tokens
seen so far and an estimate of the time left, and one JSON object per step in
``--metrics-jsonl``).
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


def count_words(value: float) -> str:
    """``1,024``, ``20.5k``, ``1.31M``, ``2.10B``: a count at a glance (tokens seen)."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{int(value):,}"


def duration_words(seconds: float) -> str:
    """``0:00:07``, ``1:02:03``, ``2d 3:04:05``: the time left, to the second."""
    whole = max(0, round(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    text = f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}d {text}" if days else text


class MetricsLogger:
    """Rank 0's step records: a line on stdout, a JSON line in ``--metrics-jsonl`` and,
    with ``tensorboard`` (a folder), TensorBoard scalars (``observe.TensorBoard``).

    ``steps``: the run's last step; the line then says the time left (``eta``): the
    steps still to run times the mean step time of the steps logged so far, the first
    left out once there are others (it pays for warm-up). A record's ``tokens_seen``
    (the trainer's ``step · TOKENS_PER_STEP``) is shown beside it."""

    def __init__(self, path, *, enabled: bool, tensorboard: str | None = None, steps: int | None = None):
        self.enabled, self.steps = enabled, steps
        self.step_times: list[float] = []
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
        seen = record.get("tokens_seen")
        self.step_times.append(record["step_time_s"])
        print(
            f"step {record['step']:>5} | loss {record['loss']:.4f} | grad_norm {record['grad_norm']:.3f}"
            f" | lr {record['lr']:.2e} | {record['tokens_per_s']:,.0f} tok/s"
            f" | mfu {'n/a' if mfu is None else f'{100 * mfu:.1f}%'}"
            f" | mem {record['peak_mem_bytes'] / 2**20:,.0f} MiB | {record['step_time_s']:.3f} s"
            + ("" if exposed is None else f" (comm exposed {exposed:.3f} s)")
            + ("" if predicted is None else f" | predicted {predicted:.3f} s")
            + ("" if val_loss is None else f" | val_loss {val_loss:.4f}")
            + ("" if seen is None else f" | {count_words(seen)} tokens")
            + ("" if self.steps is None else f" | eta {duration_words(self.eta_s(record['step']))}"),
            flush=True,
        )
        if self.file:
            self.file.write(json.dumps(record, sort_keys=True) + "\n")
            self.file.flush()
        if self.board:
            self.board.log(record)

    def eta_s(self, step: int) -> float:
        """Seconds left after ``step``: the steps to go times the mean logged step time."""
        times = self.step_times[1:] or self.step_times
        return max(0, self.steps - step) * sum(times) / max(1, len(times))

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
