"""A build of a spec with `auto` runs the planner's winner and logs its prediction.

Issue 7: ``parc build`` records the prediction in plan.json, and the trainer's logs
show predicted beside measured step time.
"""

from __future__ import annotations

import json

from .harness import build_and_run


def test_auto_layout_logs_predicted_beside_measured(tmp_path):
    overrides = ["parallel.dp=auto", "parallel.tp=auto", "parallel.pp=auto", "train.micro_batch=auto",
                 "mesh.devices_per_node=2"]
    records = build_and_run("gpt.par", tmp_path, nproc=2, overrides=overrides, steps=2)
    plan = json.loads((tmp_path / "plan.json").read_text())
    predicted = plan["predicted"]["step_time_s"]
    assert predicted > 0
    for record in records:
        assert record["predicted_step_time_s"] == round(predicted, 6)
        assert record["step_time_s"] > 0
    degrees = {axis["axis"]: axis["size"] for axis in plan["mesh"]["axes"]}
    assert degrees["dp"] * degrees["tp"] * degrees["pp"] == 2
    batch = plan["batch"]
    assert batch["micro_batch"] * batch["grad_accum"] * degrees["dp"] == batch["global_batch"]
