"""`parc data prepare --tokenizer`: text through a Hugging Face tokenizers file (offline).

A small BPE is trained with ``tokenizers`` on text in this repository (docs/), saved as
a local ``tokenizer.json``, and used as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")

from parc.codegen.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EOT = "<|endoftext|>"


def train_bpe(path: Path, vocab_size: int = 400, special=(EOT,)) -> tokenizers.Tokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train([str(ROOT / "docs" / "DESIGN.md")], trainer)
    tokenizer.save(str(path))
    return tokenizer


def read_ids(path: Path, dtype: str) -> list[int]:
    ids = array("H" if dtype == "uint16" else "I")
    ids.frombytes(path.read_bytes())
    return ids.tolist()


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    tokenizer = train_bpe(folder / "tokenizer.json")
    return folder / "tokenizer.json", tokenizer


def test_documents_are_encoded_and_separated_by_end_of_text(bpe, tmp_path, capsys):
    path, tokenizer = bpe
    docs = [ROOT / "README.md", ROOT / "docs" / "language.md"]
    out = tmp_path / "train.bin"
    assert main(["data", "prepare", *map(str, docs), "-o", str(out), "--tokenizer", str(path)]) == 0
    eot = tokenizer.token_to_id(EOT)
    expected = []
    for doc in docs:
        expected += tokenizer.encode(doc.read_text(encoding="utf-8"), add_special_tokens=False).ids + [eot]
    ids = read_ids(out, "uint16")
    assert ids == expected
    assert tokenizer.decode(ids[: ids.index(eot)]) == docs[0].read_text(encoding="utf-8")  # byte-level BPE round-trips
    info = json.loads(out.with_suffix(".json").read_text())
    assert info == {
        "tokenizer": "tokenizer.json", "vocab_size": tokenizer.get_vocab_size(), "dtype": "uint16",
        "tokens": len(ids), "separator": eot, "min_vocab": tokenizer.get_vocab_size(),
        "sources": ["README.md", "language.md"],
    }
    assert f"wrote {out}: {len(ids)} tokens (uint16), vocab >= {tokenizer.get_vocab_size()}" in capsys.readouterr().out


def test_a_vocabulary_past_65535_is_uint32(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70_000)} | {"[UNK]": 70_000, "</s>": 70_001}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "big.json"))
    (tmp_path / "a.txt").write_text("w1 w69999 w65536 nope")
    out = tmp_path / "t.bin"
    assert main(["data", "prepare", str(tmp_path / "a.txt"), "-o", str(out), "--tokenizer", str(tmp_path / "big.json")]) == 0
    assert read_ids(out, "uint32") == [1, 69_999, 65_536, 70_000, 70_001]  # </s> found as end-of-text
    assert json.loads(out.with_suffix(".json").read_text())["dtype"] == "uint32"
    # asked for uint16, such a vocabulary is refused rather than wrapped
    assert main(["data", "prepare", str(tmp_path / "a.txt"), "-o", str(tmp_path / "u.bin"), "--tokenizer",
                 str(tmp_path / "big.json"), "--dtype", "uint16"]) == 1
    assert "--dtype uint16 holds ids below 65,536, but" in capsys.readouterr().err


def _sparse(tmp_path, ids: dict[str, int]) -> Path:
    """A word-level tokenizer whose ids have gaps (the count of entries is not the largest id + 1)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(ids, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "sparse.json"))
    (tmp_path / "a.txt").write_text("a far b")
    return tmp_path / "sparse.json"


def test_sparse_ids_record_the_largest_id_plus_one(tmp_path, capsys):
    path = _sparse(tmp_path, {"a": 0, "b": 1, "[UNK]": 2, "</s>": 3, "far": 900})
    out = tmp_path / "t.bin"
    assert main(["data", "prepare", str(tmp_path / "a.txt"), "-o", str(out), "--tokenizer", str(path)]) == 0
    assert read_ids(out, "uint16") == [0, 900, 1, 3]
    info = json.loads(out.with_suffix(".json").read_text())
    assert (info["vocab_size"], info["min_vocab"]) == (901, 901)  # not 5 entries: id 900 needs a row
    spec = tmp_path / "s.par"
    spec.write_text((ROOT / "examples" / "tiny.par").read_text().replace(
        "  data = synthetic\n", '  data = tokens("t.bin")\n'))  # vocab = 512 < 901
    capsys.readouterr()
    assert main(["check", str(spec)]) == 1
    assert "tokenizer sparse.json of 901 tokens, but the model's vocab is 512" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [None, "uint16"])
def test_sparse_ids_past_65535_need_uint32(tmp_path, capsys, dtype):
    """Five entries, one of them id 70,000: uint32 chosen, or uint16 refused in one line (no traceback,
    no file written), as for a dense vocabulary of that size."""
    path = _sparse(tmp_path, {"a": 0, "b": 1, "[UNK]": 2, "</s>": 3, "far": 70_000})
    out = tmp_path / "t.bin"
    args = ["data", "prepare", str(tmp_path / "a.txt"), "-o", str(out), "--tokenizer", str(path)]
    if dtype is None:
        assert main(args) == 0
        assert read_ids(out, "uint32") == [0, 70_000, 1, 3]
        assert json.loads(out.with_suffix(".json").read_text())["dtype"] == "uint32"
        return
    assert main(args + ["--dtype", dtype]) == 1
    err = capsys.readouterr().err
    assert err == (f"parc data prepare: --dtype uint16 holds ids below 65,536, but {path} has ids up to 70,000: "
                   "use --dtype uint32 (or leave --dtype out)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "sparse.json"]


def test_a_smaller_vocab_is_refused_and_a_fitting_one_trains(bpe, tmp_path, capsys):
    path, tokenizer = bpe
    project = tmp_path / "project"
    project.mkdir()
    out = project / "train.bin"
    assert main(["data", "prepare", str(ROOT / "docs" / "DESIGN.md"), "-o", str(out), "--tokenizer", str(path)]) == 0
    spec = project / "tiny.par"
    spec.write_text((ROOT / "examples" / "tiny.par").read_text().replace(
        "  data = synthetic\n", '  data = tokens("train.bin")\n').replace("vocab = 512", "vocab = 300"))
    capsys.readouterr()
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "error[PAR0120]: train.bin was made by the tokenizer tokenizer.json of 400 tokens, but the model's vocab is 300" in err
    assert main(["build", str(spec), "-o", str(tmp_path / "refused")]) == 1
    assert not (tmp_path / "refused").exists()
    spec.write_text(spec.read_text().replace("vocab = 300", "vocab = 512"))
    one_rank = ["--set", "parallel.dp=1", "--set", "parallel.tp=1", "--set", "mesh.devices_per_node=1"]
    assert main(["build", str(spec), "-o", str(tmp_path / "build"), *one_rank]) == 0
    done = subprocess.run([sys.executable, "train.py", "--steps", "2", "--metrics-jsonl", "m.jsonl"],
                          cwd=tmp_path / "build", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in (tmp_path / "build" / "m.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)


def test_without_an_end_of_text_token_say_how(tmp_path, capsys):
    train_bpe(tmp_path / "plain.json", special=())
    (tmp_path / "a.txt").write_text("hello")
    args = ["data", "prepare", str(tmp_path / "a.txt"), "-o", str(tmp_path / "t.bin"), "--tokenizer", str(tmp_path / "plain.json")]
    assert main(args) == 1
    assert "name its own with --eot TOKEN, or pass --no-separator" in capsys.readouterr().err
    assert not (tmp_path / "t.bin").exists()
    assert main(args + ["--no-separator"]) == 0


def test_a_file_that_is_not_a_tokenizer_is_one_line(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "bad.json").write_text('{"not": "a tokenizer"}')
    assert main(["data", "prepare", str(tmp_path / "a.txt"), "-o", str(tmp_path / "t.bin"), "--tokenizer",
                 str(tmp_path / "bad.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"parc data prepare: --tokenizer {tmp_path / 'bad.json'}: not a tokenizers file (")
    assert main(["data", "prepare", str(tmp_path / "a.txt"), "-o", str(tmp_path / "t.bin"), "--tokenizer",
                 str(tmp_path / "missing.json")]) == 2
