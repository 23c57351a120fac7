"""bench/pipe_trace.py's replay: the schedule's lists run with measured computes, messages free.
It must agree with runtime/schedules/schedule_sim on uniform times (the figure the
bench's notes compare a measured span with)."""

import importlib.util
from pathlib import Path

import pytest

from parc.runtime.schedules.schedule import COMPUTE, build_schedule
from parc.runtime.schedules.schedule_sim import simulate

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_pipe_trace", ROOT / "bench" / "pipe_trace.py")
pipe_trace = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipe_trace)


def _durations(schedule, forward, backward, weight=0.0):
    split = any(a.op.name == "WEIGHT" for actions in schedule for a in actions)
    took = {"FORWARD": forward, "BACKWARD": backward - weight if split else backward, "WEIGHT": weight}
    return [{(a.op.name, a.micro, a.chunk): took[a.op.name] for a in actions if a.op in COMPUTE}
            for actions in schedule]


@pytest.mark.parametrize("kind,chunks", [("1f1b", 1), ("interleaved", 2), ("zero_bubble_v", 2), ("gpipe", 1)])
def test_replay_of_uniform_computes_is_the_simulators_makespan(kind, chunks):
    schedule = build_schedule(kind, stages=2, micro_batches=8, chunks=chunks)
    weight = 1.0 if kind == "zero_bubble_v" else 0.0
    expected = simulate(schedule, forward_time=1.0, backward_time=2.0, weight_time=weight or None).makespan
    assert pipe_trace.replay(schedule, _durations(schedule, 1.0, 2.0, weight)) == pytest.approx(expected)


def test_a_slow_compute_on_the_critical_path_lengthens_the_replay():
    schedule = build_schedule("1f1b", stages=2, micro_batches=8)
    durations = _durations(schedule, 1.0, 2.0)
    base = pipe_trace.replay(schedule, durations)
    durations[0][("FORWARD", 0, 0)] = 4.0  # stage 1 waits for it
    assert pipe_trace.replay(schedule, durations) == pytest.approx(base + 3.0)


def test_the_steady_replay_takes_each_kind_of_compute_at_its_median():
    """One step's slow compute leaves the replay at the medians (the schedule's own bubble
    under steady times) where it is; per rank, each kind's total at its median."""
    schedule = build_schedule("zero_bubble_v", stages=2, micro_batches=4, chunks=2)
    steps = [_durations(schedule, 1.0, 2.0, 1.0) for _ in range(3)]
    expected = simulate(schedule, forward_time=1.0, backward_time=2.0, weight_time=1.0).makespan
    steps[1][0][("FORWARD", 0, 0)] = 9.0
    makespan, sums = pipe_trace.steady_replay(schedule, steps)
    assert makespan == pytest.approx(expected)
    assert sums[0][("FORWARD", 0)] == pytest.approx(4.0) and len(sums[0]) == 6
    for step in steps[:2]:  # rank 0's first chunk slower at every micro-batch of two steps of three
        step[0].update({key: 3.0 for key in step[0] if key[0] == "FORWARD" and key[2] == 0})
    makespan, sums = pipe_trace.steady_replay(schedule, steps)
    assert sums[0][("FORWARD", 0)] == pytest.approx(12.0) and makespan > expected
