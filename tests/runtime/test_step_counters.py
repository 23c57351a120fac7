"""The step's own counters: evaluation between a step and its record is not counted in the
step's ``exposed_comm_s`` or ``comm_bytes`` (as ``step_time_s`` leaves it out)."""

from __future__ import annotations

import time

import torch

from parc.codegen.lower import lower
from parc.codegen.render_eval import step_lines
from parc.dsl import load
from parc.runtime.distributed.comm import ExposedClock
from parc.runtime.distributed.traffic import Traffic


def test_an_excluded_block_leaves_the_steps_exposed_time_and_collectives():
    clock = ExposedClock()
    with clock.measure():
        time.sleep(0.01)
    clock.collectives = 3
    before = clock.seconds()
    with clock.excluded():
        with clock.measure():
            time.sleep(0.01)
        clock.collectives += 5
        assert clock.seconds() > before  # counted while inside, as anything else would be
    assert (clock.seconds(), clock.collectives) == (before, 3)


def test_an_excluded_block_leaves_the_steps_bytes():
    traffic = Traffic()
    traffic.add("dp", torch.zeros(4))
    with traffic.excluded():
        traffic.add("dp", torch.zeros(100))
        traffic.add("pp_forward", torch.zeros(7))
    assert traffic.by_axis() == {"dp": 16}


def test_train_py_evaluates_outside_the_steps_counters():
    plan = lower(load("examples/tiny.par", ["train.eval=every(2, batches = 1)"]))
    lines = step_lines(plan)
    with_line = lines.index("with comm.exposed_clock.excluded(), traffic.comm_bytes.excluded():")
    assert lines[with_line + 1].strip().startswith("val_loss = evaluator.run(net)")
