"""Watching a run: the start-up banner, TensorBoard scalars and a profiler trace.

Takes: the trainer's facts at start-up (layout, model, data, checkpoint folder, the
planner's prediction when the build recorded one) and each step's metrics record.
Gives: ``banner`` (rank 0 prints what will run, before step 1), ``TensorBoard`` (the
step records as scalars, ``--tensorboard DIR`` or ``train.log = tensorboard(dir)``;
the ``tensorboard`` package is needed only then) and ``StepProfiler`` (``--profile
STEPS``: a ``torch.profiler`` Chrome trace of those steps, one file per rank, each
step marked ``ProfilerStep#N``). ``metrics.MetricsLogger`` calls ``TensorBoard``.
"""

from __future__ import annotations

import os

import torch

from . import faults
from .flags import steps_of
from ..paths import UnwritablePath, check_target

MIB = 2**20


def _count(value: float) -> str:
    return f"{value / 1e6:,.1f}M" if value >= 1e5 else f"{int(value):,}"


def local_parameters(model) -> int:
    """Parameters this rank holds (tied weights once): its shard of the model."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def per_rank(value: int, device) -> list[int]:
    """``value`` of every rank, in rank order (collective when a process group is up)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [int(value)]
    local = torch.tensor([int(value)], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(local) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, local)
    return [int(t.item()) for t in gathered]


def banner_lines(
    *, title: str, layout: str, parameters: int, parameters_per_rank: list[int], data: str,
    checkpoint_dir: str | None, predicted_step_time_s: float | None = None,
    predicted_mem_bytes: float | None = None, tensorboard: str | None = None,
) -> list[str]:
    """The banner's lines (pure: the tests read them back)."""
    low, high = min(parameters_per_rank), max(parameters_per_rank)
    shard = _count(low) if low == high else f"{_count(low)}–{_count(high)}"
    lines = [
        f"parc trainer: {title}",
        f"  layout      {layout} ({len(parameters_per_rank)} rank(s))",
        f"  parameters  {_count(parameters)} total, {shard} per rank",
    ]
    if predicted_mem_bytes is not None or predicted_step_time_s is not None:
        parts = []
        if predicted_mem_bytes is not None:
            parts.append(f"{predicted_mem_bytes / MIB:,.0f} MiB peak per rank")
        if predicted_step_time_s is not None:
            parts.append(f"{predicted_step_time_s:.3f} s per step")
        lines.append("  predicted   " + ", ".join(parts) + " (the planner's, plan.json)")
    lines.append(f"  data        {data}")
    lines.append(f"  checkpoints {checkpoint_dir if checkpoint_dir else 'none (--checkpoint-dir DIR)'}")
    if tensorboard:
        lines.append(f"  tensorboard {tensorboard}")
    return lines


def banner(model, *, rank: int, device, **facts) -> None:
    """Print the banner on rank 0 (collective: every rank gives its parameter count).
    Hands ``model`` to the test-only faults (Note [injected faults] in faults.py)."""
    faults.poison_loss(model)
    counts = per_rank(local_parameters(model), device)
    if rank == 0:
        print("\n".join(banner_lines(parameters_per_rank=counts, **facts)), flush=True)


class TensorBoard:
    """Every numeric field of each step record as a TensorBoard scalar, by step.

    Nested lists of records (``memory_per_rank``) become ``name/rank{i}/field``.
    """

    def __init__(self, directory: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise SystemExit(
                "train.py: --tensorboard needs the tensorboard package, which is not installed: "
                "pip install tensorboard (or run without --tensorboard)"
            ) from None
        try:
            check_target(directory, folder=True)
        except UnwritablePath as exc:
            raise SystemExit(f"train.py: --tensorboard {exc}") from None
        self.writer = SummaryWriter(log_dir=directory)

    def log(self, record: dict) -> None:
        step = record["step"]
        for tag, value in sorted(scalars(record).items()):
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def scalars(record: dict, prefix: str = "") -> dict[str, float]:
    """The record's numbers under TensorBoard tags (``step`` is the x axis, not a tag)."""
    out = {}
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if key == "step" and not prefix:
            continue
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            out[tag] = float(value)
        elif isinstance(value, dict):
            out.update(scalars(value, tag + "/"))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    out.update(scalars(item, f"{tag}/rank{i}/"))
                elif isinstance(item, (int, float)) and not isinstance(item, bool):
                    out[f"{tag}/{i}"] = float(item)
    return out


def parse_steps(text: str) -> tuple[int, int]:
    """``--profile STEPS``: ``N`` (one step) or ``A-B`` (steps A to B, both included)
    (``flags.steps_of``; the trainer's argparse has checked it already)."""
    try:
        return steps_of(text)
    except ValueError as exc:
        raise SystemExit(f"train.py: --profile {exc}") from None


class StepProfiler:
    """``torch.profiler`` over steps ``first``..``last``; ``begin``/``end`` bracket each step.

    Writes ``DIR/trace-rank{R}.json`` (Chrome trace format: chrome://tracing, Perfetto)
    after ``last`` (or at ``close`` when the run stops earlier).
    """

    def __init__(self, steps: str | None, directory: str, *, rank: int, device):
        self.range = parse_steps(steps) if steps else None
        self.path = os.path.join(directory, f"trace-rank{rank}.json")
        self.rank, self.device = rank, device
        self.profile = self.marker = None
        if self.range:
            try:
                check_target(directory, folder=True)
            except UnwritablePath as exc:
                raise SystemExit(f"train.py: --profile-dir {exc}") from None

    def begin(self, step: int) -> None:
        faults.at_step_start(step)  # test-only faults (Note [injected faults] in faults.py)
        if not self.range or not self.range[0] <= step <= self.range[1]:
            return
        if self.profile is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profile = torch.profiler.profile(activities=activities, record_shapes=False)
            self.profile.__enter__()
        self.marker = torch.profiler.record_function(f"ProfilerStep#{step}")
        self.marker.__enter__()

    def end(self, step: int) -> None:
        if self.marker is not None:
            self.marker.__exit__(None, None, None)
            self.marker = None
        if self.profile is not None and step >= self.range[1]:
            self.close()

    def close(self) -> None:
        if self.profile is None:
            return
        if self.marker is not None:
            self.marker.__exit__(None, None, None)
            self.marker = None
        self.profile.__exit__(None, None, None)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self.profile.export_chrome_trace(self.path)
        self.profile = None
        if self.rank == 0:
            where = self.path.replace("trace-rank0", "trace-rank*")
            print(f"profiler trace of steps {self.range[0]}-{self.range[1]} written to {where}", flush=True)
