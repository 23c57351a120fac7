"""Shared runs of the checkpoint tests: each layout's 8-step run, made once per session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from .trainer import LAYOUTS, STEPS, build, records, run


@dataclass(frozen=True)
class Straight:
    build: Path
    checkpoints: Path
    rows: list


@pytest.fixture(scope="session")
def straight(tmp_path_factory):
    """``straight(layout)``: 8 steps without a break, saving at steps 4 and 8."""
    cache = {}

    def get(layout: str) -> Straight:
        if layout not in cache:
            out = tmp_path_factory.mktemp(f"straight_{layout}")
            build_dir = build(layout, out / "build")
            metrics = out / "metrics.jsonl"
            args = ["--steps", str(STEPS), "--checkpoint-dir", str(out / "ck"), "--checkpoint-every", "4",
                    "--metrics-jsonl", str(metrics)]
            run(build_dir, LAYOUTS[layout][1], args)
            cache[layout] = Straight(build_dir, out / "ck", records(metrics))
        return cache[layout]

    return get
