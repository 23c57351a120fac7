"""Note [stage costs] (codegen/planner/cost/bubble.py): a schedule ordered by each virtual
stage's own (F, B, W) gets them from the planner's cost model, the planner's exact makespan
builds its lists with them, and the build renders the same integers into train.py."""

from parc.codegen.build import generate
from parc.codegen.lower import lower
from parc.codegen.planner.cost.bubble import makespan, stage_costs
from parc.codegen.planner.cost.fit import hardware_for
from parc.codegen.planner.cost.time import pipeline_stage_costs
from parc.codegen.planner.search import fixed_layout
from parc.dsl import load_text
from parc.runtime.schedules.schedule import COMPUTE, build_schedule
from parc.runtime.schedules.schedule_sim import simulate

SPEC = """
model m {
  arch = llama
  layers = 4
  hidden = 128
  heads = 4
  kv_heads = 4
  ffn = 512
  vocab = 512
  seq_len = 64
  tie_embeddings = false
}
mesh {
  nodes = 1
  devices_per_node = 2
  device = cpu
}
parallel {
  dp = 1
  tp = 1
  pp = 2
  schedule = SCHEDULE
  zero = 0
  cp = 1
  ep = 1
  sp = false
}
train {
  global_batch = 16
  micro_batch = 2
  steps = 2
  optimizer = adamw(lr = 3e-4)
  precision = fp32
  seed = 1
  data = synthetic
}
"""


def spec(schedule: str):
    return load_text(SPEC.replace("SCHEDULE", schedule), "m.par")


def test_the_stages_own_costs():
    """The first stage has no input gradient (B the least, W its whole backward); the last
    holds the head (its F and backward the largest); the middle ones split half and half."""
    _, costs = stage_costs("zero_bubble_v", stages=2, chunks=2, forward=1.0, backward=2.0, head_forward=0.5)
    assert costs == ((9, 1, 18), (9, 9, 9), (9, 9, 9), (13, 13, 13))  # tenths of the mean, 1.125
    assert stage_costs("1f1b", stages=2, chunks=1, forward=1.0, backward=2.0, head_forward=0.5) is None


def test_build_renders_what_the_planner_orders_by():
    zbv = spec("zero_bubble_v")
    unit, costs = pipeline_stage_costs(zbv, fixed_layout(zbv), hardware_for(zbv))
    assert len(costs) == 4 and costs[0][1] == 1 and costs[0][2] > costs[1][2] and costs[3][0] > costs[1][0]
    assert lower(zbv).pipeline.stage_costs == costs
    train = generate(zbv)["train.py"].decode()
    assert f"STAGE_COSTS = {costs!r}" in train and "costs=STAGE_COSTS" in train
    assert lower(spec("1f1b")).pipeline.stage_costs is None
    assert "STAGE_COSTS" not in generate(spec("1f1b"))["train.py"].decode()


def test_exact_makespan_runs_the_costed_lists():
    """The lists built with the costs, each compute at its stage's cost, less the head's
    computes that cost/time.py adds per micro-batch."""
    unit, costs = stage_costs("zero_bubble_v", stages=2, chunks=2, forward=1.0, backward=2.0, head_forward=0.5)
    lists = build_schedule("zero_bubble_v", stages=2, micro_batches=8, chunks=2, costs=costs)
    place = lists.placement
    span = simulate(lists, comm_time=0.0,
                    action_time=lambda r, a: costs[place.stage(r, a.chunk)][COMPUTE.index(a.op)]).makespan
    got = makespan("zero_bubble_v", stages=2, micro_batches=8, chunks=2, forward=1.0, backward=2.0, comm=0.0,
                   exact=True, costs=(unit, costs), head=1.5)
    assert abs(got - (unit * span - 8 * 1.5)) < 1e-9
