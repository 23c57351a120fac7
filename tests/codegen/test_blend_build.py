"""data = tokens([...], weights = [...]): a blend builds, renders and trains, its documents
separate (each file's OUT.idx, in training and in the held-out tails eval reads)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from parc.codegen.cli import main

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "tests" / "parity" / "specs" / "gpt.par"  # the parity suite's small model, one rank


def test_a_blend_with_a_held_out_tail_trains(tmp_path, capsys):
    project = tmp_path / "project"
    project.mkdir()
    for name, text in (("a", "the quick brown fox. "), ("b", "jumps over the lazy dog! ")):
        (tmp_path / f"{name}.txt").write_text(text * 150)
        assert main(["data", "prepare", str(tmp_path / f"{name}.txt"), "-o", str(project / f"{name}.bin")]) == 0
    spec = project / "gpt.par"
    spec.write_text(SPEC.read_text())
    out = tmp_path / "build"
    blend = 'train.data=tokens(["a.bin", "b.bin"], weights = [1, 3])'
    assert main(["build", str(spec), "-o", str(out), "--set", blend,
                 "--set", "train.eval=every(steps = 2, batches = 1)",
                 "--set", "model.vocab=320", "--set", "model.documents=separate"]) == 0  # bytes, separator: 257 ids
    capsys.readouterr()
    train = (out / "train.py").read_text()
    assert 'DATA_PATH = ("../project/a.bin", "../project/b.bin")' in train
    assert "DATA_WEIGHTS = (1.0, 3.0)  # --set 1: each file's share" in train
    assert "data.blend(" in train and "part=data.VAL_PART" in train and "TokenFile" not in train
    assert train.count("documents=DOCUMENTS") == 3  # the model, the training blend, the validation tails
    plan = json.loads((out / "plan.json").read_text())["train"]["data"]
    assert plan["weights"] == [1.0, 3.0] and plan["path"] == ["../project/a.bin", "../project/b.bin"]
    done = subprocess.run([sys.executable, "train.py", "--steps", "2", "--metrics-jsonl", "m.jsonl"],
                          cwd=out, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    banner = next(line for line in done.stdout.splitlines() if line.startswith("  data "))
    assert banner.endswith("project/a.bin, " + str(out / "../project/b.bin") + " by (1.0, 3.0) (uint16)")  # no list
    assert "  data        blend of " in banner and "[" not in banner
    records = [json.loads(line) for line in (out / "m.jsonl").read_text().splitlines()]
    assert records[-1]["val_loss"] is not None
