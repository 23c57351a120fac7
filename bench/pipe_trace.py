"""Where a pipelined step's time goes, per rank, on both sides of bench/peer.py.

Run under torchrun in place of the script it traces; it wraps the functions that make
up a step (each compute, each wait on a stage boundary's message, the posting of
messages, clipping, the optimizer, the step's small collectives) with a wall clock
(``time.perf_counter``: one clock for every process on the machine, so the ranks'
timelines line up) and this thread's CPU clock, then runs the script unchanged:

    torchrun --nproc-per-node 2 bench/pipe_trace.py OUT parc BUILD/train.py --steps 8
    torchrun --nproc-per-node 2 bench/pipe_trace.py OUT titan bench/peer_titan.py --pp 2 ...

Each rank writes OUT/trace-rank<r>.json: its events (name, start, end, CPU seconds,
micro-batch) and each step's bounds with the process's CPU time (``time.process_time``:
gloo's threads included). ``python bench/pipe_trace.py --report OUT [--skip 2]
[--schedule KIND --chunks C --micro-batches M]`` prints per rank and step the wall
time, the CPU time and the time in each kind of event; with a schedule, the pipeline
span against a replay of parc's lists with the measured computes and free messages
(what the messages cost); and the last step's timeline of the computes and the waits.
Environment: ``PIPE_PROFILE=N`` profiles N steps after the warm-up (each rank's ops by
self CPU into OUT/ops-rank<r>.txt); ``PIPE_LOOKAHEAD=K`` (parc) posts receives K
computes ahead instead of p2p.lookahead's depth (Note [pre-posted receives]).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import resource
import runpy
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

EVENTS: list[tuple] = []  # (name, start, end, thread CPU seconds, micro-batch or None, page faults)
STEPS: list[tuple] = []  # (start, process CPU at start, main thread CPU at start)


def timed(name, fn, micro=None):
    """``fn`` recording each call as an event ``name``; ``micro(args)`` names its micro-batch."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        f0, c0, t0 = _faults(), time.thread_time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            t1, c1 = time.perf_counter(), time.thread_time()
            EVENTS.append((name, t0, t1, c1 - c0, None if micro is None else micro(args), _faults() - f0))

    return wrapper


def _faults() -> int:
    """This thread's page faults so far (minor: a fresh page of memory handed out)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


PROFILE = {"steps": int(os.environ.get("PIPE_PROFILE", "0")), "profiler": None}
"""PIPE_PROFILE=N: torch.profiler over steps 3..N+2 (after 2 warm-up), each rank's ops by self CPU."""


def _profile(out: Path) -> None:
    import torch

    done = len(STEPS) - 1  # steps begun before this one
    if PROFILE["profiler"] is None and done == 2 and PROFILE["steps"]:
        PROFILE["profiler"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        PROFILE["profiler"].__enter__()
    elif PROFILE["profiler"] is not None and done == 2 + PROFILE["steps"]:
        profiler, PROFILE["profiler"] = PROFILE["profiler"], None
        profiler.__exit__(None, None, None)
        table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        (out / f"ops-rank{os.environ.get('RANK', '0')}.txt").write_text(table)


def step_start(fn, out: Path):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        STEPS.append((time.perf_counter(), time.process_time(), time.thread_time()))
        _profile(out)
        return fn(*args, **kwargs)

    return wrapper


def patch_parc(build: Path, out: Path) -> None:
    import torch

    sys.path.insert(0, str(build))
    from parc_runtime.optimizers import optim
    from parc_runtime.train import data, faults

    if (build / "parc_runtime" / "parallel" / "pipeline").is_dir():  # a pipelined build
        from parc_runtime.parallel.pipeline import p2p, pipeline

        executor = pipeline.PipelineExecutor
        executor._compute = timed("compute", executor._compute,
                                  micro=lambda a: (a[1].op.name, a[1].micro, a[1].chunk))
        p2p.Posted.wait = timed("wait", p2p.Posted.wait)
        pipeline.post_batch = timed("post", pipeline.post_batch)
        if os.environ.get("PIPE_LOOKAHEAD"):  # an experiment: receives posted that many computes ahead
            pipeline.lookahead = lambda device: int(os.environ["PIPE_LOOKAHEAD"])
        pipeline.loss_over_pipeline = timed("loss_allreduce", pipeline.loss_over_pipeline)
    from parc_runtime.models.transformer import Transformer

    # the model's own forward and backward: one stage's F and B; inside the executor's
    # computes, what the executor adds around them
    Transformer.forward = timed("model_forward", Transformer.forward)
    torch.Tensor.backward = timed("model_backward", torch.Tensor.backward)
    torch.autograd.backward = timed("model_backward", torch.autograd.backward)
    optim.clip_grad_norm_ = timed("clip", optim.clip_grad_norm_)
    optim.set_lr = step_start(optim.set_lr, out)
    faults.StepGuard.check = timed("guard", faults.StepGuard.check)
    data.SyntheticTokens.batch = timed("data", data.SyntheticTokens.batch)
    build_optimizer = optim.build_optimizer

    def traced_optimizer(*args, **kwargs):
        optimizer = build_optimizer(*args, **kwargs)
        optimizer.step = timed("optimizer", optimizer.step)
        optimizer.zero_grad = timed("zero_grad", optimizer.zero_grad)
        return optimizer

    optim.build_optimizer = traced_optimizer


def patch_titan(out: Path) -> None:
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here / ".peer" / "site"), str(here)]
    import peer_titan

    peer_titan._cpu_device()  # before any torchtitan module copies the device's name
    import torch
    import torch.distributed.pipelining.schedules as schedules
    import torch.distributed.pipelining.stage as stage
    import torchtitan.distributed.utils as dist_utils
    from torchtitan.components.optimizer import OptimizersContainer
    from torchtitan.trainer import Trainer

    base = stage._PipelineStageBase
    # the chunk as parc numbers it: interleaved and V placements alike put a rank's
    # stages below pp_size in its chunk 0 (2 chunks a rank)
    base.forward_one_chunk = timed("compute", base.forward_one_chunk,
                                   micro=lambda a: ("FORWARD", a[1], a[0].stage_index // a[0].group_size))
    base.backward_one_chunk = timed("compute", base.backward_one_chunk,
                                    micro=lambda a: ("BACKWARD", a[1], a[0].stage_index // a[0].group_size))
    base.backward_weight_one_chunk = timed("compute", base.backward_weight_one_chunk,
                                           micro=lambda a: ("WEIGHT", a[1], a[0].stage_index // a[0].group_size))
    schedules._wait_batch_p2p = timed("wait", schedules._wait_batch_p2p)
    schedules._batch_p2p = timed("post", schedules._batch_p2p)
    schedules._PipelineSchedule._maybe_compute_loss = timed("loss", schedules._PipelineSchedule._maybe_compute_loss)
    dist_utils.clip_grad_norm_ = timed("clip", dist_utils.clip_grad_norm_)
    OptimizersContainer.step = timed("optimizer", OptimizersContainer.step)
    OptimizersContainer.zero_grad = timed("zero_grad", OptimizersContainer.zero_grad)
    Trainer.train_step = step_start(Trainer.train_step, out)
    if "--pp" not in sys.argv or sys.argv[sys.argv.index("--pp") + 1] == "1":  # one stage, as parc's above
        from torchtitan.models.llama3.model import Llama3Model

        Llama3Model.forward = timed("model_forward", Llama3Model.forward)
        torch.Tensor.backward = timed("model_backward", torch.Tensor.backward)


def dump(out: Path) -> None:
    rank = int(os.environ.get("RANK", "0"))
    STEPS.append((time.perf_counter(), time.process_time(), time.thread_time()))  # the last step's end (roughly)
    (out / f"trace-rank{rank}.json").write_text(json.dumps({"events": EVENTS, "steps": STEPS}))


def step_rows(trace, skip: int):
    """Per step after ``skip``: (start, end, process CPU, {kind: [wall, thread CPU, calls, faults]});
    the kind ``other threads`` is the process's CPU beside the main thread's (gloo's I/O
    threads, mostly), in traces that recorded the main thread's."""
    steps, events, rows = trace["steps"], trace["events"], []
    for s in range(skip, len(steps) - 2):  # the last bound is the process's exit: not a step
        (t0, p0, *m0), (t1, p1, *m1) = steps[s], steps[s + 1]
        sums: dict[str, list[float]] = {}
        for name, a, b, cpu, micro, faults in (e for e in events if t0 <= e[1] < t1):
            entry = sums.setdefault(name if micro is None else f"{name}:{micro[0][0]}", [0.0, 0.0, 0, 0])
            for i, value in enumerate((b - a, cpu, 1, faults)):
                entry[i] += value
        if m0 and m1:
            sums["other threads"] = [0.0, (p1 - p0) - (m1[0] - m0[0]), 0, 0]
        rows.append((t0, t1, p1 - p0, sums))
    return rows


def summary(traces, skip: int) -> None:
    for r, trace in enumerate(traces):
        rows = step_rows(trace, skip)
        print(f"rank {r}: {len(rows)} steps, medians (ms): wall {1e3 * statistics.median(b - a for a, b, _, _ in rows):.1f}"
              f", process CPU {1e3 * statistics.median(c for _, _, c, _ in rows):.1f}")
        for key in sorted({k for *_, sums in rows for k in sums}):
            wall, cpu, count, faults = (statistics.median(s.get(key, [0, 0, 0, 0])[i] for *_, s in rows)
                                        for i in range(4))
            print(f"  {key:<16} wall {1e3 * wall:8.1f}  thread CPU {1e3 * cpu:8.1f}  calls {count:4.0f}  "
                  f"page faults {faults:6.0f}")


def replay(schedule, durations) -> float:
    """The makespan of ``schedule``'s lists (schedule.py, Note [the execution model]) when
    each compute takes its measured ``durations[rank][(op, micro, chunk)]`` and messages
    take no time: runtime/schedules/schedule_sim's ``simulate`` with each action's own time."""
    from parc.runtime.schedules.schedule_sim import simulate

    def measured(rank, action):
        return durations[rank][(action.op.name, action.micro, action.chunk)]

    return simulate(schedule, placement=schedule.placement, action_time=measured).makespan


def critical_path(traces, skip: int, kind: str, chunks: int, micro_batches: int) -> None:
    """Each step's pipeline span (first compute's start to last compute's end, over the
    ranks) against a replay of ``kind``'s lists in which every compute takes the time it
    took and messages are free: what the span holds beyond the replay is time lost to
    the messages (their latency, the waiting rank's wake-up), the rest is the schedule's
    own bubble given these computes. Then the lists replayed with every compute of a kind
    (rank, op, chunk) at that kind's median over the steps, the per-step noise (a compute
    slowed by a preemption) taken out: the schedule's own bubble under steady compute
    times, against the busiest rank's sum of them."""
    from parc.runtime.schedules.schedule import build_schedule

    schedule = build_schedule(kind, stages=len(traces), micro_batches=micro_batches, chunks=chunks)
    spans, replays, idles, steps = [], [], [], []
    for s in range(skip, min(len(trace["steps"]) for trace in traces) - 2):
        durations, first, last, busy = [], [], [], []
        for trace in traces:  # each rank's step s, between its own step starts
            t0, t1 = trace["steps"][s][0], trace["steps"][s + 1][0]
            took, previous = {}, None
            for name, a, b, _, micro, _ in trace["events"]:
                if not (name in ("compute", "loss") and t0 <= a < t1):
                    continue
                if name == "loss":  # torchtitan's, outside its forward: parc's forward holds it
                    if previous is not None:
                        took[previous] += b - a
                    continue
                previous = tuple(micro)
                took[previous] = b - a
                first.append(a)
                last.append(b)
            durations.append(took)
            busy.append(sum(took.values()))
        span = max(last) - min(first)
        spans.append(span)
        replays.append(replay(schedule, durations))
        steps.append(durations)
        idles.append([span - b for b in busy])
    print(f"pipeline span, median over {len(spans)} steps: measured {1e3 * statistics.median(spans):.1f} ms, "
          f"replayed with the measured computes and free messages {1e3 * statistics.median(replays):.1f} ms "
          f"(lost to messages: {1e3 * statistics.median(a - b for a, b in zip(spans, replays)):+.1f} ms); "
          "idle inside the span per rank: "
          + ", ".join(f"{1e3 * statistics.median(i[r] for i in idles):.1f}" for r in range(len(traces))))
    makespan, sums = steady_replay(schedule, steps)
    print(f"replayed with each kind of compute at its median: {1e3 * makespan:.1f} ms; "
          "per rank, its computes at their medians (ms, op:chunk) "
          + "; ".join(f"rank {r} {1e3 * sum(parts.values()):.1f} = "
                      + " ".join(f"{op[0]}{chunk} {1e3 * t:.1f}" for (op, chunk), t in sorted(parts.items()))
                      for r, parts in enumerate(sums)))


def steady_replay(schedule, steps) -> tuple[float, list[dict]]:
    """``steps``: per step, ``durations`` as ``replay`` takes them. The makespan of the lists
    with every compute of a kind (rank, op, chunk) at that kind's median over the steps and
    all its micro-batches, and per rank each kind's total at that median."""
    every = [{} for _ in schedule]
    for durations in steps:
        for r, took in enumerate(durations):
            for (op, _, chunk), seconds in took.items():
                every[r].setdefault((op, chunk), []).append(seconds)
    typical = [{key: statistics.median(times) for key, times in kinds.items()} for kinds in every]
    last = steps[-1]
    steady = [{(op, micro, chunk): typical[r][(op, chunk)] for op, micro, chunk in last[r]} for r in range(len(last))]
    counts = [Counter((op, chunk) for op, _, chunk in last[r]) for r in range(len(last))]
    sums = [{key: typical[r][key] * n for key, n in counts[r].items()} for r in range(len(last))]
    return replay(schedule, steady), sums


def timeline(traces) -> None:
    """The last full step's computes and waits, every rank on rank 0's clock."""
    s = len(traces[0]["steps"]) - 3
    t0, t1 = traces[0]["steps"][s][0], traces[0]["steps"][s + 1][0]
    print(f"timeline of step {s + 1} (ms from rank 0's step start; compute op/micro, wait)")
    for r, trace in enumerate(traces):
        line = []
        for name, a, b, _, micro, _ in trace["events"]:
            if t0 - 0.05 <= a < t1 and name in ("compute", "wait", "loss") and b - a > 0.0002:
                tag = f"{micro[0][0]}{micro[1]}" if micro else name[0]
                line.append(f"{tag}[{1e3 * (a - t0):.0f},{1e3 * (b - t0):.0f}]")
        print(f"  rank {r}: " + " ".join(line))


def report(argv) -> None:
    parser = argparse.ArgumentParser(prog="pipe_trace.py --report")
    parser.add_argument("out", type=Path)
    parser.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    parser.add_argument("--schedule", default=None, help="parc's kind (1f1b, interleaved, ...): compare with schedule_sim")
    parser.add_argument("--chunks", type=int, default=1)
    parser.add_argument("--micro-batches", type=int, default=8)
    args = parser.parse_args(argv)
    paths = sorted(args.out.glob("trace-rank*.json"), key=lambda p: int(p.stem[len("trace-rank"):]))
    traces = [json.loads(p.read_text()) for p in paths]
    for trace in traces:  # traces written before page faults were counted: none
        trace["events"] = [e if len(e) == 6 else [*e, 0] for e in trace["events"]]
    summary(traces, args.skip)
    if args.schedule:
        critical_path(traces, args.skip, args.schedule, args.chunks, args.micro_batches)
    timeline(traces)


def main() -> None:
    if sys.argv[1] == "--report":
        report(sys.argv[2:])
        return
    out, side, script, *rest = sys.argv[1:]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if side == "parc":
        patch_parc(Path(script).resolve().parent, out)
    else:
        patch_titan(out)
    atexit.register(dump, out)
    sys.argv = [script, *rest]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
