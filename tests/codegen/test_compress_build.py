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


def test_fused_embedding_sync_is_the_default_where_buckets_reduce(tmp_path):
    """Note [fused embedding synchronization] (runtime/parallel/pipeline/pipeline.py): pp 2 × dp 2 with the tied
    table reduces its copies in the dp buckets' all-reduce; ZeRO keeps the separate sum."""
    text, _ = built(tmp_path, "parallel.pp=2", "parallel.dp=2", "mesh.devices_per_node=4")
    assert 'tied_group = pipeline.embedding_group(grid, "dp")' in text
    assert "tied_group=tied_group" in text and "allreduce_tied_grads" not in text
    text, _ = built(tmp_path, "parallel.pp=2", "parallel.dp=2", "mesh.devices_per_node=4", "parallel.zero=2")
    assert "pipeline.tied_embedding_group(grid)" in text and "pipeline.allreduce_tied_grads(net, tied_group)" in text


def test_compression_under_zero_and_fp16(tmp_path):
    text, _ = built(tmp_path, "parallel.dp=2", "mesh.devices_per_node=2", "parallel.zero=2",
                    "parallel.compress=topk(ratio = 0.1)", "train.precision=fp16")
    assert "grad_sync = compress.TopKGradients(" in text and "loss_scaled=True" in text
    assert "grad_sync=grad_sync" in text  # zero.ShardedAdamW keeps its slice of the mean
    assert "reduce_gradients_and_clip(GRAD_CLIP, grad_scale=scaled_by)" in text
    text, _ = built(tmp_path, "parallel.dp=2", "mesh.devices_per_node=2", "parallel.compress=powersgd(rank = 2)",
                    "train.precision=fp16")
    assert "grad_sync.finish(scaled_by)" in text
