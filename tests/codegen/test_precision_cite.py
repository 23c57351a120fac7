"""Generated code cites its origin (STYLE rule 4): every train.py of a low-precision spec
names the spec line of ``train.precision``, whatever the stack (issue 31: ZeRO-3, HSDP
and compress_pp with bf16 did not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parc import dsl
from parc.codegen.build import generate

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.par"
STACKS = {
    "dp-tp": [],
    "zero3": ["parallel.zero=3"],
    "hsdp": ["parallel.zero=3", "parallel.zero_shard=node", "parallel.dp=4", "parallel.tp=1", "mesh.nodes=2",
             "mesh.devices_per_node=2"],
    "compress_pp": ["parallel.pp=2", "parallel.dp=1", "parallel.compress_pp=lowrank(rank = 2)"],
    "pp-zero3": ["parallel.pp=2", "parallel.dp=2", "parallel.tp=1", "parallel.zero=3"],
    "compress": ["parallel.compress=powersgd(rank = 2)"],
    "per-layer": ["parallel.tp=[2, 2, 1, 1]", "parallel.dp=[2, 2, 4, 4]"],
}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("stack", STACKS)
def test_train_py_cites_the_precision_line(tmp_path, stack, precision):
    spec_path = tmp_path / "tiny.par"
    spec_path.write_text(TINY.read_text().replace("precision = fp32", f"precision = {precision}"))
    line = TINY.read_text().splitlines().index("  precision = fp32") + 1
    try:
        spec = dsl.load(str(spec_path), STACKS[stack])
    except dsl.Diagnostics:
        pytest.skip(f"{stack} with {precision} is refused by check")
    train = generate(spec)["train.py"].decode()
    assert f"tiny.par:{line}:" in train or f"tiny.par:{line})" in train, stack
