"""A build of a spec with `auto` runs the planner's winner and logs its prediction.

Issue 7: ``parc build`` records the prediction in plan.json, and the trainer's logs
show predicted beside measured step time. The run shares the parity suite's launch
of its world size (tests/conftest.py's ``trainers``).
"""

from __future__ import annotations

import json

from .batch import Case

AUTO = Case(
    "planned-auto",
    "gpt.par",
    ("parallel.dp=auto", "parallel.tp=auto", "parallel.pp=auto", "train.micro_batch=auto", "mesh.devices_per_node=2"),
    2,
    ("--steps", "2"),
)


def cases_of(item) -> list[Case]:
    """The runs a selected test of this module reads (tests/conftest.py's ``trainers``)."""
    return [AUTO] if item.originalname == "test_auto_layout_logs_predicted_beside_measured" else []


def test_auto_layout_logs_predicted_beside_measured(trainers):
    run = trainers.run(AUTO)
    records = run.records
    plan = json.loads((run.build / "plan.json").read_text())
    predicted = plan["predicted"]["step_time_s"]
    assert predicted > 0
    for record in records:
        assert record["predicted_step_time_s"] == round(predicted, 6)
        assert record["step_time_s"] > 0
    degrees = {axis["axis"]: axis["size"] for axis in plan["mesh"]["axes"]}
    assert degrees["dp"] * degrees["tp"] * degrees["pp"] == 2
    batch = plan["batch"]
    assert batch["micro_batch"] * batch["grad_accum"] * degrees["dp"] == batch["global_batch"]
