"""data = tokens("...bin"): `parc data prepare` output trains end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from parc.codegen.cli import main

ROOT = Path(__file__).resolve().parents[2]
ONE_RANK = ["--set", "parallel.dp=1", "--set", "parallel.tp=1", "--set", "mesh.devices_per_node=1"]


def test_prepared_text_trains(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    tokens = tmp_path / "corpus.bin"
    assert main(["data", "prepare", str(text), "-o", str(tokens)]) == 0
    out = tmp_path / "build"
    spec = str(ROOT / "examples" / "tiny.par")
    assert main(["build", spec, "-o", str(out), *ONE_RANK, "--set", 'train.data=tokens("corpus.bin")']) == 0
    train = (out / "train.py").read_text()
    assert "DATA_PATH = 'corpus.bin'" in train or 'DATA_PATH = "corpus.bin"' in train
    assert "SyntheticTokens" not in train
    # The path is resolved from the cwd at run time (never made absolute at build time).
    done = subprocess.run([sys.executable, str(out / "train.py"), "--steps", "3", "--metrics-jsonl", "m.jsonl"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and losses[-1] < losses[0]
    # --data overrides the spec's path.
    tokens.rename(tmp_path / "moved.bin")
    done = subprocess.run([sys.executable, str(out / "train.py"), "--steps", "1", "--data", "moved.bin"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
