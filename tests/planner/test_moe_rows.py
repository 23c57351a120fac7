"""The rows a MoE block routes on one rank: the planner's count (cost/experts.py
``routed_rows``, Note [MoE costs]) against what the runtime's ``MoEMLP`` hands to its
experts' exchange on each rank of a 2-rank tp group (tests/planner/moe_rows_worker.py),
with and without sequence parallelism and expert parallelism. Under sp each tp rank
routes its own sequence shard; the planner once counted the whole micro-batch there,
pricing expert compute and all-to-all tp× too high."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from parc.codegen.planner.cost.experts import routed_rows
from parc.codegen.planner.search import fixed_layout
from parc.dsl import load

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "runtime"))
from ranks import launch  # noqa: E402

sys.path.insert(0, str(HERE))
from moe_rows_worker import CASES, CONFIG, MICRO_BATCH  # noqa: E402

SPEC = HERE.parent / "parity" / "specs" / "llama.par"


@pytest.fixture(scope="module")
def runtime_rows(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("moe-rows")
    launch(HERE / "moe_rows_worker.py", 2, [str(out)], out, timeout=240)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def planner_rows(sp: bool, ep: int) -> float:
    keys = ("layers", "hidden", "heads", "kv_heads", "ffn", "seq_len", "experts", "top_k")
    spec = load(str(SPEC), [f"model.{key}={CONFIG[key]}" for key in keys] + [
        "model.vocab=32", "parallel.tp=2", f"parallel.sp={'true' if sp else 'false'}", f"parallel.ep={ep}",
        "parallel.etp=1", "mesh.devices_per_node=2", f"train.micro_batch={MICRO_BATCH}",
        f"train.global_batch={MICRO_BATCH}"])
    layout = fixed_layout(spec)
    assert (layout.tp, layout.sp, layout.ep) == (2, sp, ep)
    return routed_rows(spec, layout, layout.tokens(spec.model.seq_len))


@pytest.mark.parametrize("case", CASES, ids=[f"sp{int(sp)}-ep{ep}" for sp, ep in CASES])
def test_planner_routes_the_rows_each_runtime_rank_routes(runtime_rows, case):
    sp, ep = case
    measured = {ranks[f"sp{int(sp)} ep{ep}"] for ranks in runtime_rows}
    assert len(measured) == 1  # dropless and balanced shapes: every rank routes as many
    assert planner_rows(sp, ep) == measured.pop()


def test_sequence_parallel_ranks_route_a_shard_not_the_micro_batch():
    tokens = MICRO_BATCH * CONFIG["seq_len"]
    assert planner_rows(True, 1) == tokens * CONFIG["top_k"] / 2  # was tokens · top_k: tp× too many
    assert planner_rows(False, 1) == tokens * CONFIG["top_k"]  # replicated experts see every token
