"""The runtime alone (no generated code), on CPU gloo: sharded equals one rank.

Two launches, one per world size (2 and 4 ranks), each running in every rank
(rank_worker.py): the communication mappings and the parallel layers against plain
modules (float64, to 1e-12), then 3 training steps of a tiny GPT and Llama in each
layout of that world size. Every layout's per-step loss and gradient norm, and the
loss after the last step, must equal the single-rank run's within 1e-5 relative
(fp32), with the same parameter names.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
RTOL = 1e-5


def _load(name):
    spec = importlib.util.spec_from_file_location(f"runtime_tests_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


loop, ranks = _load("runtime_loop"), _load("ranks")
WORLDS = {world: [name for name, (dp, tp, _, _) in loop.LAYOUTS.items() if dp * tp == world] for world in (2, 4)}
CHECKS = ["comm", "column-sp0", "row-sp0", "embedding-sp0", "column-sp1", "row-sp1", "embedding-sp1",
          "cross-entropy"]


@pytest.fixture(scope="module")
def reference():
    """The single-rank run of each arch, in this process."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the ranks
    try:
        return {arch: loop.train(arch, loop.single_rank()) for arch in ("gpt", "llama")}
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """world size → the per-rank results of one launch."""
    out = {}
    for world, layouts in WORLDS.items():
        folder = tmp_path_factory.mktemp(f"world{world}")
        ranks.launch(HERE / "rank_worker.py", world, [str(folder), *layouts], folder)
        out[world] = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]
    return out


def assert_close(actual, expected, what):
    assert math.isfinite(actual), f"{what}: {actual} is not finite"
    assert abs(actual - expected) <= RTOL * abs(expected), (
        f"{what}: {actual!r} vs single-rank {expected!r} "
        f"(relative difference {abs(actual - expected) / abs(expected):.3g} > {RTOL})"
    )


@pytest.mark.parametrize("world", sorted(WORLDS))
@pytest.mark.parametrize("check", CHECKS)
def test_layers_match_plain_modules(runs, world, check):
    for rank, result in enumerate(runs[world]):
        assert result["checks"][check] == "ok", f"tp{world} rank {rank}:\n{result['checks'][check]}"


def test_fused_embedding_sync(runs):
    """tests/runtime/embedding_sync_check.py: pp 2 × dp 2, fused equals separate, one collective less."""
    for rank, result in enumerate(runs[4]):
        assert result["checks"]["embedding-sync"] == "ok", f"rank {rank}:\n{result['checks']['embedding-sync']}"


@pytest.mark.parametrize("arch", ["gpt", "llama"])
@pytest.mark.parametrize("layout", list(loop.LAYOUTS))
def test_layout_matches_single_rank(runs, reference, layout, arch):
    dp, tp, _, _ = loop.LAYOUTS[layout]
    want = reference[arch]
    for rank, result in enumerate(runs[dp * tp]):
        got = result["layouts"][layout][arch]
        assert got["names"] == want["names"], f"{layout} rank {rank}: parameter names differ"
        assert len(got["steps"]) == len(want["steps"]) == 3
        for step, ((loss, norm), (want_loss, want_norm)) in enumerate(zip(got["steps"], want["steps"]), 1):
            assert_close(loss, want_loss, f"{arch} {layout} rank {rank} step {step} loss")
            assert_close(norm, want_norm, f"{arch} {layout} rank {rank} step {step} grad norm")
        assert_close(got["final_loss"], want["final_loss"], f"{arch} {layout} rank {rank} loss after step 3")


def test_reference_trains(reference):
    """The comparison means something: the steps change the loss, and clipping is active."""
    for arch, result in reference.items():
        losses = [loss for loss, _ in result["steps"]] + [result["final_loss"]]
        assert losses[-1] < losses[0] - 0.01, f"{arch}: {losses}"
        assert max(norm for _, norm in result["steps"]) > 0.5, f"{arch}: clipping never engaged"
