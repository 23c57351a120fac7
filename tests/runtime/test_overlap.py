"""overlap.py and dp overlap at the runtime level, on 2 CPU gloo ranks (overlap_worker.py).

Sub-batched blocks (``sub_batches = 2``) give the unsplit run's loss and gradients
(float64, to 1e-10) for GPT and Llama, with and without sequence parallelism, with
each recompute; recompute = full under sub-batches issues no extra collective; each
forward collective but the last is waited only after a later one was launched; under
per-layer tp only the blocks at tp > 1 split, over their own tp group;
overlapped gradient buckets give the blocking ones' means.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _load(name):
    spec = importlib.util.spec_from_file_location(f"overlap_tests_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ranks = _load("ranks")
CHECKS = [
    f"sub_batches {arch} sp={sp} recompute={recompute}"
    for arch in ("gpt", "llama") for sp in (False, True) for recompute in ("none", "selective", "full")
] + [f"recompute collectives {arch} sp={sp}" for arch in ("gpt", "llama") for sp in (False, True)] + [
    f"schedule {arch} sp={sp}" for arch in ("gpt", "llama") for sp in (False, True)
] + [
    f"gradient overlap {arch} accumulations={n}" for arch in ("gpt", "llama") for n in (1, 2)
] + [f"hetero {arch} sp={sp}" for arch in ("gpt", "llama") for sp in (False, True)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("overlap")
    ranks.launch(HERE / "overlap_worker.py", 2, [str(folder)], folder)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("check", CHECKS)
def test_overlap(check, results):
    for rank, result in enumerate(results):
        assert result.get(check) == "ok", f"rank {rank}: {result.get(check, 'not run')}"
