"""``train.eval`` over token files: a ``val`` file (``--val-data``) or the file's held-out tail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from parc.codegen.cli import main
from parc.runtime.train import data

ROOT = Path(__file__).resolve().parents[2]
ONE_RANK = ["--set", "parallel.dp=1", "--set", "parallel.tp=1", "--set", "mesh.devices_per_node=1",
            "--set", "train.global_batch=4", "--set", "train.eval=every(2, batches = 1)"]


def write_tokens(path: Path, count: int, seed: int) -> None:
    np.random.default_rng(seed).integers(0, 512, count, dtype=np.uint16).tofile(path)


def build(tmp_path, data_value: str) -> Path:
    spec = tmp_path / "tiny.par"
    spec.write_text((ROOT / "examples" / "tiny.par").read_text())
    out = tmp_path / "build"
    assert main(["build", str(spec), "-o", str(out), *ONE_RANK, "--set", f"train.data={data_value}"]) == 0
    return out


def run(out: Path, *flags: str) -> list[dict]:
    (out / "m.jsonl").unlink(missing_ok=True)  # the trainer appends
    done = subprocess.run([sys.executable, "train.py", "--steps", "2", "--metrics-jsonl", "m.jsonl", *flags],
                          cwd=out, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return [json.loads(line) for line in (out / "m.jsonl").read_text().splitlines()]


def test_a_val_file_is_evaluated_and_overridable(tmp_path, capsys):
    write_tokens(tmp_path / "train.bin", 20_000, 1)
    write_tokens(tmp_path / "val.bin", 5_000, 2)
    out = build(tmp_path, 'tokens("train.bin", val = "val.bin")')
    train = (out / "train.py").read_text()
    assert 'VAL_DATA_PATH = "../val.bin"' in train and "--val-data PATH" in train
    assert "part=data.TRAIN_PART" not in train  # a val file: the whole training file trains
    records = run(out)
    assert records[0].get("val_loss") is None and records[1]["val_loss"] > 0
    # another validation file gives another val_loss, training unchanged
    write_tokens(tmp_path / "other.bin", 5_000, 3)
    again = run(out, "--val-data", str(tmp_path / "other.bin"))
    assert again[1]["loss"] == records[1]["loss"] and again[1]["val_loss"] != records[1]["val_loss"]


def test_without_a_val_file_the_tail_is_held_out(tmp_path, capsys):
    write_tokens(tmp_path / "train.bin", 20_000, 1)
    out = build(tmp_path, 'tokens("train.bin")')
    train = (out / "train.py").read_text()
    assert "part=data.TRAIN_PART" in train and "part=data.VAL_PART" in train
    records = run(out)
    assert records[1]["val_loss"] > 0


def test_held_out_windows_never_overlap_training_ones(tmp_path):
    path = tmp_path / "t.bin"
    np.arange(10_000, dtype=np.uint16).tofile(path)
    seq = 16
    train = data.TokenFile(str(path), seq, part=data.TRAIN_PART, seed=3)
    val = data.TokenFile(str(path), seq, part=data.VAL_PART, seed=3)
    boundary = int(10_000 * data.TRAIN_PART[1])
    inputs, targets = train.batch(range(500))
    assert int(targets.max()) < boundary  # the window's last token too
    inputs, _ = val.batch(range(500))
    assert int(inputs.min()) >= boundary


def test_synthetic_validation_stream_is_disjoint_and_alike():
    train = data.SyntheticTokens(256, 32, seed=7)
    val = data.ValidationStream(train)
    a, _ = train.batch([0, 1])
    b, _ = val.batch([0, 1])
    assert not torch.equal(a, b)
    assert torch.equal(b, train.batch([data.ValidationStream.FIRST, data.ValidationStream.FIRST + 1])[0])


def test_the_spec_reads_back(tmp_path):
    """The normalized document keeps eval, val and log, and loads back to the same spec."""
    from parc.dsl import load
    from parc.dsl.build_spec import spec_document

    spec = tmp_path / "s.par"
    text = (ROOT / "examples" / "tiny.par").read_text().replace(
        "  data = synthetic\n",
        '  data = tokens("t.bin", val = "v.bin")\n  eval = every(5, batches = 3)\n  log = tensorboard("tb")\n',
    )
    spec.write_text(text)
    loaded = load(str(spec))
    document = spec_document(loaded)
    train = document["train"]
    assert train["data"] == {"kind": "tokens", "path": "t.bin", "dtype": "uint16", "val": "v.bin"}
    assert train["eval"] == {"kind": "every", "steps": 5, "batches": 3}
    assert train["log"] == {"kind": "tensorboard", "dir": "tb"}
    assert (loaded.train.eval_every, loaded.train.eval_batches, loaded.train.tensorboard_dir) == (5, 3, "tb")
    (tmp_path / "s.json").write_text(json.dumps(document))
    assert load(str(tmp_path / "s.json")).train == loaded.train


def test_under_cp_each_rank_evaluates_its_chunks_of_the_sequences():
    """The trainer passes the evaluator this rank's cp place and kind (``render_context.CHUNK_ARGS``):
    its micro-batches are the tokens ``data.context_chunk`` gives the rank, as training's are."""
    from parc.runtime.train import evaluate

    val = data.ValidationStream(data.SyntheticTokens(256, 16, seed=3))
    common = dict(every=1, batches=1, micro_batch=2, grad_accum=1, dp_rank=0, dp_size=1, device=torch.device("cpu"))
    whole = evaluate.Evaluator(val, **common).micro_batches(0)[0]
    for kind in ("ring", "allgather"):
        place = dict(cp_rank=1, cp_size=2, cp_kind=kind)
        inputs, targets = evaluate.Evaluator(val, **common, **place).micro_batches(0)[0][:2]
        want = data.context_chunk(whole[0], whole[1], **place)
        assert inputs.shape == (2, 8) and torch.equal(inputs, want[0]) and torch.equal(targets, want[1])
