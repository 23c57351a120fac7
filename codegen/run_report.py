"""``parc report``'s work: a run's metrics file read back and drawn as PNGs.

Takes: the JSON lines a trainer wrote with ``--metrics-jsonl`` (``runtime/train/metrics.py``:
one object per logged step, rank 0's). Gives: ``read_records`` (the records, or
``ReportError`` naming the file and line) and ``draw`` (``loss.png``, ``tokens_per_s.png``,
``exposed_comm.png``, ``memory_per_rank.png``, and ``val_loss`` on ``loss.png`` when the
run evaluated), each with the planner's prediction as a dashed line where the build
recorded one (``predicted_*`` fields: builds of ``auto`` specs). matplotlib is imported
here only, with its file-only backend. Before: a run. After: nothing.
"""

from __future__ import annotations

import json
import os

from parc.runtime.paths import UnreadableFile, read_limited

MIB = 2**20
MEMORY_PARTS = ("param_bytes", "grad_bytes", "optim_bytes", "activation_peak_bytes")


class ReportError(ValueError):
    """A metrics file that cannot be drawn; the message names the file (and line) and why."""


def read_records(path: str) -> list[dict]:
    """The step records of ``path`` in file order (a resumed run appends: later wins per step)."""
    try:
        text = read_limited(path).decode("utf-8")
    except UnreadableFile as exc:
        raise ReportError(str(exc)) from None
    except UnicodeDecodeError:
        raise ReportError(f"{path} is not UTF-8 text (a --metrics-jsonl file)") from None
    by_step: dict[int, dict] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReportError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ReportError(f"{path}:{number}: not a step record of --metrics-jsonl (no integer \"step\")")
        by_step[record["step"]] = record
    if not by_step:
        raise ReportError(f"{path} holds no step records")
    return [by_step[step] for step in sorted(by_step)]


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def _predicted(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return float(values[-1]) if values else None


def draw(records: list[dict], folder: str, *, title: str = "") -> list[str]:
    """Write the PNGs into ``folder``; returns their paths in a fixed order."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    from matplotlib import pyplot

    os.makedirs(folder, exist_ok=True)
    written = []

    def figure(name: str, ylabel: str, lines, predicted=None, predicted_label=""):
        fig, axes = pyplot.subplots(figsize=(7, 4), dpi=100)
        for label, (steps, values) in lines:
            axes.plot(steps, values, marker="." if len(steps) < 50 else None, label=label)
        if predicted is not None:
            axes.axhline(predicted, linestyle="--", color="grey", label=predicted_label)
        axes.set_xlabel("step")
        axes.set_ylabel(ylabel)
        axes.set_title(f"{title} {name}".strip())
        axes.grid(alpha=0.3)
        axes.legend()
        path = os.path.join(folder, f"{name}.png")
        fig.tight_layout()
        fig.savefig(path)
        pyplot.close(fig)
        written.append(path)

    loss_lines = [("loss", _series(records, "loss"))]
    if _series(records, "val_loss")[0]:
        loss_lines.append(("val_loss", _series(records, "val_loss")))
    figure("loss", "loss", loss_lines)
    speed = _predicted(records, "predicted_tokens_per_s")
    figure("tokens_per_s", "tokens/s", [("measured", _series(records, "tokens_per_s"))],
           speed, "planner's prediction")
    comm = _predicted(records, "predicted_exposed_comm_s")
    figure("exposed_comm", "seconds per step", [
        ("exposed communication", _series(records, "exposed_comm_s")),
        ("step time", _series(records, "step_time_s")),
    ], comm, "planner's prediction")
    figure("memory_per_rank", "MiB", _memory_lines(records),
           None if _predicted(records, "predicted_peak_mem_bytes") is None
           else _predicted(records, "predicted_peak_mem_bytes") / MIB, "planner's peak per rank")
    return written


def _memory_lines(records: list[dict]):
    """Each rank's held bytes (parameters + gradients + optimizer + saved activations), MiB."""
    ranks = max((len(r.get("memory_per_rank") or ()) for r in records), default=0)
    lines = []
    for rank in range(ranks):
        steps, values = [], []
        for r in records:
            rows = r.get("memory_per_rank") or ()
            if rank < len(rows):
                steps.append(r["step"])
                values.append(sum(rows[rank].get(part, 0) for part in MEMORY_PARTS) / MIB)
        lines.append((f"rank {rank}", (steps, values)))
    if not lines:
        lines.append(("peak (this process)", _series(records, "peak_mem_bytes")))
        lines[0] = (lines[0][0], (lines[0][1][0], [v / MIB for v in lines[0][1][1]]))
    return lines
