"""Context-parallel attention (runtime/parallel/context/context.py) on 2 and 4 CPU gloo ranks (context_worker.py).

Ring, Ulysses and allgather attention on each rank's T/cp tokens equal full causal
attention's rows of that rank, forward and backward (float64); the whole GPT and
Llama on T/cp tokens give the one-rank loss and gradients once averaged over cp.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _load(name):
    spec = importlib.util.spec_from_file_location(f"context_tests_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ranks = _load("ranks")
CHECKS = [f"{what} {arch} {kind}" for what in ("attention", "model") for arch in ("gpt", "llama")
          for kind in ("ring", "ulysses", "allgather")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("context")
    ranks.launch(HERE / "context_worker.py", 2, [str(folder)], folder)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("check", CHECKS)
def test_context_parallel(check, results):
    for rank, result in enumerate(results):
        assert result.get(check) == "ok", f"rank {rank}: {result.get(check, 'not run')}"


@pytest.fixture(scope="module")
def ring4(tmp_path_factory):
    """Ring attention over 4 ranks: each holds chunks r and 7 − r of 8, K/V go round three times."""
    folder = tmp_path_factory.mktemp("context4")
    ranks.launch(HERE / "context_worker.py", 4, [str(folder), "ring"], folder)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(4)]


@pytest.mark.parametrize("check", [c for c in CHECKS if c.endswith(" ring")])
def test_ring_over_four_ranks(check, ring4):
    for rank, result in enumerate(ring4):
        assert result.get(check) == "ok", f"rank {rank}: {result.get(check, 'not run')}"
