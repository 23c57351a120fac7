"""docs/customize.md's recipes, each an edit of a generated train.py that a rebuild keeps,
and the trainer's --eval-only.

One one-rank build of the tiny spec (wsd schedule, evaluation every 2 steps) is edited
with every recipe of the guide at once (text taken from the guide itself), rebuilt after
a change of the spec (the merge must keep each edit and apply the new STEPS), and run for
2 steps with a checkpoint; each test then reads its recipe's effect from that run. Three
trainer runs in all (the recipes, --eval-only, --eval-only without a checkpoint).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parc.codegen.build import build_to


def env() -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PARC_", "TORCHELASTIC_"))}
    return dict(clean, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "customize.md").read_text(encoding="utf-8")
SETS = ["parallel.dp=1", "parallel.tp=1", "mesh.devices_per_node=1", "train.global_batch=2",
        "model.layers=2", "model.hidden=64", "model.heads=2", "model.ffn=128", "model.vocab=128",
        "model.seq_len=32", "train.eval=every(2, batches = 1)", "train.schedule=wsd(warmup = 1, decay = 2)"]


def recipe(title: str) -> list[str]:
    """The code blocks of the guide's section ``title``."""
    section = GUIDE.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def replace_line(text: str, starts: str, new: str) -> str:
    """``text`` with the statement starting ``starts`` (to its closing line) replaced by ``new``."""
    lines = text.split("\n")
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(starts))
    end, depth = at, 0
    while True:
        depth += lines[end].count("(") - lines[end].count(")")
        if depth <= 0:
            break
        end += 1
    return "\n".join(lines[:at] + new.rstrip("\n").split("\n") + lines[end + 1:])


def before_main(text: str, code: str) -> str:
    return text.replace("\ndef main() -> None:\n", "\n" + code + "\n\ndef main() -> None:\n", 1)


def customize(train: Path) -> None:
    text = train.read_text(encoding="utf-8")
    schedule, lr_line = recipe("Your own learning-rate schedule")
    text = before_main(text, schedule)
    text = replace_line(text, "lr = optim.lr_at(", lr_line.split("\n")[0])  # the block's first line
    code, data_line = recipe("Your own data")
    imports, loader = code.split("\n", 1)
    text = text.replace("\nimport time\n", "\nimport time\n" + imports.split("  #")[0] + "\n", 1)
    text = before_main(text, loader)
    text = replace_line(text, "dataset = data.SyntheticTokens(", data_line)
    (term,) = recipe("Your own loss term")
    text = text.replace("\n    return loss\n", "\n" + term, 1)  # loss_fn's body
    (metric,) = recipe("Your own metrics")
    text = text.replace('"tokens_seen": step * TOKENS_PER_STEP,\n', metric.lstrip(), 1)
    train.write_text(text, encoding="utf-8")


def trainer(build: Path, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(build / "train.py"), *args], cwd=build, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == expect, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def edited(tmp_path_factory):
    """The customized build, rebuilt with steps 6 (the guide's edits merged), after 2 steps."""
    root = tmp_path_factory.mktemp("customize")
    build = build_to(ROOT / "examples" / "tiny.par", root / "build", SETS)
    customize(build / "train.py")
    mine = (build / "train.py").read_text(encoding="utf-8")
    build_to(ROOT / "examples" / "tiny.par", build, [*SETS, "train.steps=6"], force=False)
    metrics, ck = root / "metrics.jsonl", root / "ck"
    done = trainer(build, "--steps", "2", "--metrics-jsonl", str(metrics), "--checkpoint-dir", str(ck))
    return dict(build=build, mine=mine, text=(build / "train.py").read_text(encoding="utf-8"),
                rows=records(metrics), ck=ck, stdout=done.stdout)


def test_the_rebuild_keeps_every_edit_and_applies_the_new_spec(edited):
    text = edited["text"]
    assert "STEPS = 6  # --set 13\n" in text and "STEPS = 20" in edited["mine"]
    for code in (*recipe("Your own learning-rate schedule"), *recipe("Your own data"),
                 *recipe("Your own loss term"), recipe("Your own metrics")[0].split("\n", 1)[1]):
        for line in code.split("  #")[0].strip().split("\n"):
            assert line.strip() in text, line
    assert "lr = optim.lr_at(\n" not in text and "dataset = data.SyntheticTokens(" not in text


def test_my_schedule_sets_each_steps_lr(edited):
    lrs = [row["lr"] for row in edited["rows"]]
    assert lrs == [3e-4, 1.5e-4]  # halving_lr: LR, then LR / 2


def test_my_metric_is_in_each_record(edited):
    assert [row["lr_ratio"] for row in edited["rows"]] == [1.0, 0.5]
    assert [row["tokens_seen"] for row in edited["rows"]] == [64, 128]  # kept beside it: 2 · 32 a step


def test_my_data_and_loss_term_train(edited):
    """The counting data is learnable at once: the loss (with the penalty) is finite and
    the trainer's val_loss at step 2 reads the same object (ValidationStream over it)."""
    rows = edited["rows"]
    assert all(row["loss"] == row["loss"] and row["loss"] > 0 for row in rows)
    assert rows[1]["val_loss"] is not None
    last = [line for line in edited["stdout"].splitlines() if line.startswith("step     2 |")]
    assert len(last) == 1 and last[0].endswith(" | 128 tokens | eta 0:00:00")  # the last step: none left


def test_eval_only_prints_the_checkpoints_val_loss(edited):
    """--eval-only: the step-2 checkpoint's val_loss, the number training logged at step 2."""
    done = trainer(edited["build"], "--eval-only", "--resume", str(edited["ck"]))
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(f"eval-only: checkpoint of step 2 ({edited['ck']}): val_loss ")
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(edited["rows"][1]["val_loss"], rel=1e-6)
    assert not [line for line in done.stdout.splitlines() if line.startswith("step ")]  # no step trained


def test_eval_only_without_a_checkpoint_is_one_line(edited):
    done = trainer(edited["build"], "--eval-only", expect=1)
    assert done.stderr.strip().splitlines()[-1] == (
        "train.py: --eval-only evaluates a checkpoint: pass --resume DIR (a checkpoint, or a "
        "folder of them: its latest)"
    )


def test_export_copies_the_tokenizer_the_specs_data_names(edited, tmp_path, capsys):
    """``parc export --spec``: the tokenizer named by the token file's record (parc data prepare
    --tokenizer writes it) is copied beside the export, its separator the config's eos."""
    from parc.codegen.cli import main

    (tmp_path / "tokenizer.json").write_text('{"model": "mine"}\n')
    (tmp_path / "train.json").write_text(json.dumps(
        {"tokenizer": "tokenizer.json", "vocab_size": 100, "dtype": "uint16", "tokens": 10, "separator": 7,
         "min_vocab": 100}))
    spec = tmp_path / "tiny.par"
    spec.write_text((ROOT / "examples" / "tiny.par").read_text().replace("data = synthetic", 'data = tokens("train.bin")'))
    out = tmp_path / "export"
    assert main(["export", str(edited["ck"]), "--to", "safetensors", str(out), "--spec", str(spec)]) == 0
    assert capsys.readouterr().out.endswith("model.safetensors and tokenizer.json beside it\n")
    assert (out / "tokenizer.json").read_text() == '{"model": "mine"}\n'
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 7
    assert main(["export", str(edited["ck"]), "--to", "safetensors", str(out), "--spec", str(spec)]) == 1
    assert "exists: remove it, or pass --force" in capsys.readouterr().err
    plain = tmp_path / "plain"
    assert main(["export", str(edited["ck"]), "--to", "safetensors", str(plain),
                 "--spec", str(ROOT / "examples" / "tiny.par")]) == 0
    assert "data names no tokenizer: none copied" in capsys.readouterr().out
    assert sorted(os.listdir(plain)) == ["config.json", "model.safetensors"]
