"""README's "Fine-tune a Hugging Face model", run as written on a tiny GPT-2.

The section's shell block is read from README.md and run line by line in a fresh
folder, with the venv's tools. The one line that needs the network (``hf download``)
is replaced by what it yields: a folder transformers wrote (a tiny random GPT-2 of
vocab 250 from hf_models.py, with a 200-token BPE ``tokenizer.json`` trained here on
tests/data). ``corpus.txt`` is that same text. The export at the end must load in
transformers with every tensor of the original's names and shapes, changed by training.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from .hf_models import hf_loss, write
from .trainer import env

tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "notes-on-bread.txt"
BIN = Path(sys.executable).parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Fine-tune a Hugging Face model\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def tokenizer_file(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train([str(CORPUS)], trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]", "<|endoftext|>"]))
    tokenizer.save(str(path))


def test_the_readme_fine_tune_flow_runs_as_written(tmp_path):
    commands = readme_commands()
    assert commands[0].startswith("hf download ") and all(c.startswith(".venv/bin/") for c in commands[1:])
    shutil.copy(CORPUS, tmp_path / "corpus.txt")
    for command in commands:
        words = shlex.split(command, comments=True)
        if words[:2] == ["hf", "download"]:  # the network's part: a folder as save_pretrained writes it
            folder = write("gpt2", tmp_path / words[words.index("--local-dir") + 1])
            tokenizer_file(folder / "tokenizer.json")
            continue
        words[0] = str(BIN / words[0].removeprefix(".venv/bin/"))
        done = subprocess.run(words, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{command}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    original, tuned = load_file(tmp_path / "gpt2" / "model.safetensors"), load_file(tmp_path / "gpt2-ft-hf" /
                                                                                     "model.safetensors")
    assert {k: v.shape for k, v in original.items()} == {k: v.shape for k, v in tuned.items()}
    assert not torch.equal(original["transformer.h.0.attn.c_attn.weight"], tuned["transformer.h.0.attn.c_attn.weight"])
    tokens = torch.arange(33).remainder(200).view(1, 33)
    assert torch.isfinite(torch.tensor(hf_loss(tmp_path / "gpt2-ft-hf", tokens[:, :-1], tokens[:, 1:])))
