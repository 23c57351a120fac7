"""MFU under ``mesh.profile`` (issue 31): the trainer's DEVICE_FLOPS is the profile's peak
(its best matmul rate, the planner's), not None, so the run logs an MFU."""

from __future__ import annotations

import json
from pathlib import Path

from parc import dsl
from parc.codegen.build import generate

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.par"
PROFILE = {"version": 1, "ranks": 1, "cores": 2, "memory_bandwidth": 1e10, "op_overhead_s": 1e-5,
           "matmul": [{"n": 64, "flops": 1e9}, {"n": 256, "flops": 4e10}, {"n": 512, "flops": 3e10}]}


def test_device_flops_come_from_the_profile(tmp_path):
    (tmp_path / "machine.json").write_text(json.dumps(PROFILE))
    text = TINY.read_text().replace("device = cpu", 'device = cpu\n  profile = "machine.json"')
    spec_path = tmp_path / "tiny.par"
    spec_path.write_text(text)
    line = text.splitlines().index('  profile = "machine.json"') + 1
    train = generate(dsl.load(str(spec_path)))["train.py"].decode()
    assert f"DEVICE_FLOPS = 40000000000.0  # tiny.par:{line}: the profile's best matmul rate, for MFU" in train


def test_without_a_profile_cpu_has_no_mfu():
    train = generate(dsl.load(str(TINY)))["train.py"].decode()
    assert "DEVICE_FLOPS = None" in train
