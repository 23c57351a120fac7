"""What train.py says for `parallel.compress` and `compress_pp` (issue 23)."""

from __future__ import annotations

import json
from pathlib import Path

from parc.codegen.build import build_to

ROOT = Path(__file__).resolve().parents[2]


def built(tmp_path, *overrides: str) -> tuple[str, dict]:
    out = Path(build_to(ROOT / "tests" / "parity" / "specs" / "gpt.par", tmp_path / "b", list(overrides)))
    return (out / "train.py").read_text(), json.loads((out / "plan.json").read_text())


def test_powersgd_replaces_the_buckets_and_cites_the_spec(tmp_path):
    text, plan = built(tmp_path, "parallel.dp=2", "mesh.devices_per_node=2", "parallel.compress=powersgd(rank = 2)")
    assert 'COMPRESS = "powersgd"  # --set 3' in text
    assert "COMPRESS_RANK = 2  # --set 3: rank of P·Qᵀ" in text
    assert "ERROR_FEEDBACK = True  # default" in text
    assert "grad_sync = compress.PowerSGDGradients(" in text and "dp.GradientBuckets(" not in text
    assert [s["name"] for s in plan["train"]["compress"]] == ["COMPRESS", "COMPRESS_RANK", "ERROR_FEEDBACK"]


def test_exact_layouts_log_bytes_and_carry_no_compression(tmp_path):
    text, plan = built(tmp_path, "parallel.dp=2", "mesh.devices_per_node=2")
    assert "dp.GradientBuckets(" in text and "COMPRESS" not in text
    assert '"comm_bytes": traffic.comm_bytes.by_axis()' in text
    assert "compress" not in plan["train"]


def test_compressed_backprop_gives_the_executor_a_codec(tmp_path):
    text, _ = built(tmp_path, "parallel.pp=2", "mesh.devices_per_node=2", "parallel.compress_pp=lowrank(rank = 2)",
                    "train.global_batch=8")
    assert "grad_codec=compress_pp.LowRankBackprop(" in text
    assert "COMPRESS_STAGES = (1,)  # default: every stage but the first" in text
    assert "LAZY_ERROR = False" in text
