"""data = tokens("...bin"): `parc data prepare` output trains end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from parc.codegen.cli import main

ROOT = Path(__file__).resolve().parents[2]
ONE_RANK = ["--set", "parallel.dp=1", "--set", "parallel.tp=1", "--set", "mesh.devices_per_node=1"]


def test_prepared_text_trains(tmp_path, capsys):
    # The layout a new user has: the spec and its data in one folder, the build in
    # another, and the run started as `parc build` says: `cd BUILD && python train.py`.
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    tokens = project / "data" / "corpus.bin"
    assert main(["data", "prepare", str(text), "-o", str(tokens)]) == 0
    spec = project / "tiny.par"
    spec.write_text((ROOT / "examples" / "tiny.par").read_text())
    out = tmp_path / "build" / "tiny"
    capsys.readouterr()
    assert main(["build", str(spec), "-o", str(out), *ONE_RANK, "--set", 'train.data=tokens("data/corpus.bin")']) == 0
    printed = capsys.readouterr()
    assert f"run `cd {out} && python train.py`" in printed.out and printed.err == ""
    train = (out / "train.py").read_text()
    # Relative to the spec's folder in the spec; relative to train.py's folder in the build.
    assert "DATA_PATH = \"../../project/data/corpus.bin\"  # --set 4: from this file's folder" in train
    assert str(tmp_path) not in train and "SyntheticTokens" not in train
    done = subprocess.run([sys.executable, "train.py", "--steps", "3", "--metrics-jsonl", "m.jsonl"],
                          cwd=out, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in (out / "m.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and losses[-1] < losses[0]
    # --data overrides the spec's path, and is from the cwd.
    tokens.rename(tmp_path / "moved.bin")
    done = subprocess.run([sys.executable, str(out / "train.py"), "--steps", "1", "--data", "moved.bin"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_missing_token_file_is_one_message_from_rank_0(tmp_path, capsys):
    spec = tmp_path / "tiny.par"
    spec.write_text((ROOT / "examples" / "tiny.par").read_text())
    out = tmp_path / "build"
    # A 2-rank build: `parc build` warns that the file is not there (PAR0219) and builds.
    two_ranks = ["--set", "parallel.dp=2", "--set", "parallel.tp=1", "--set", "mesh.devices_per_node=2"]
    assert main(["build", str(spec), "-o", str(out), *two_ranks, "--set", 'train.data=tokens("nope.bin")']) == 0
    assert "warning[PAR0219]: no token file at" in capsys.readouterr().err
    torchrun = Path(sys.executable).parent / "torchrun"
    done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "train.py"],
                          cwd=out, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith("train.py:")]
    assert said == [f"train.py: --data {tmp_path}/build/../nope.bin: no such file"], done.stderr[-3000:]
