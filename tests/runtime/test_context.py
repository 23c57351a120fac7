"""Context-parallel attention (runtime/context.py) on 2 CPU gloo ranks (context_worker.py).

Ulysses and allgather attention on each rank's T/cp tokens equal full causal
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
          for kind in ("ulysses", "allgather")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("context")
    ranks.launch(HERE / "context_worker.py", 2, [str(folder)], folder)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("check", CHECKS)
def test_context_parallel(check, results):
    for rank, result in enumerate(results):
        assert result.get(check) == "ok", f"rank {rank}: {result.get(check, 'not run')}"
