"""`parc data prepare` over real corpora: JSON Lines, folders, streaming, the .idx."""

import json
from array import array

import pytest

from parc.codegen.cli import main


def ids_of(path, code="H"):
    values = array(code)
    values.frombytes(path.read_bytes())
    return list(values)


def prepare(*args):
    return main(["data", "prepare", *map(str, args)])


def test_jsonl_field_documents_and_index(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"body": "ab", "id": 1}\n\n{"body": "c"}\n')
    out = tmp_path / "t.bin"
    assert prepare(src, "-o", out, "--field", "body") == 0
    assert ids_of(out) == [97, 98, 256, 99, 256]
    assert ids_of(out.with_suffix(".idx"), "Q") == [0, 3]  # the blank line is no document
    assert json.loads(out.with_suffix(".json").read_text())["sources"] == ["docs.jsonl"]


def test_folder_reads_its_text_and_jsonl_in_sorted_order(tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "b.txt").write_bytes(b"B")
    (folder / "a.jsonl").write_text('{"text": "x"}\n{"text": "yz"}\n')
    (folder / "notes.md").write_text("skipped")
    (folder / ".hidden.txt").write_text("skipped")
    out = tmp_path / "t.bin"
    assert prepare(folder, "-o", out) == 0
    assert ids_of(out) == [120, 256, 121, 122, 256, 66, 256]
    assert ids_of(out.with_suffix(".idx"), "Q") == [0, 2, 5]
    assert "1 other files skipped" in capsys.readouterr().out


def test_empty_folder_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert prepare(tmp_path / "empty", "-o", tmp_path / "t.bin") == 1
    assert "no .txt, .jsonl or .json file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "line, message",
    [("{not json", "a.jsonl:2: not a JSON line"), ('{"title": "x"}', "a.jsonl:2: no field 'text'"),
     ('{"text": 3}', "a.jsonl:2: field 'text' is int, not a string")],
)
def test_bad_json_line_names_file_and_line_and_writes_nothing(tmp_path, capsys, line, message):
    (tmp_path / "a.jsonl").write_text('{"text": "fine"}\n' + line + "\n")
    out = tmp_path / "out" / "t.bin"
    assert prepare(tmp_path / "a.jsonl", "-o", out) == 1
    assert message in capsys.readouterr().err
    assert list((tmp_path / "out").iterdir()) == []  # no .bin, .idx, .json nor temporary left behind


def test_streaming_with_a_small_buffer_equals_one_shot(tmp_path, capsys):
    text = tmp_path / "big.txt"
    text.write_bytes(bytes(range(256)) * 40)  # 10,240 bytes through a 64-token buffer
    lines = tmp_path / "many.jsonl"
    lines.write_text("".join(json.dumps({"text": f"doc {i} " * (i % 7)}) + "\n" for i in range(300)))
    one_shot, streamed = tmp_path / "one.bin", tmp_path / "streamed.bin"
    assert prepare(text, lines, "-o", one_shot) == 0
    assert prepare(text, lines, "-o", streamed, "--buffer", "64", "--progress") == 0
    assert "documents" in capsys.readouterr().err  # progress was asked for
    for suffix in (".bin", ".idx"):
        assert streamed.with_suffix(suffix).read_bytes() == one_shot.with_suffix(suffix).read_bytes()
    ids = ids_of(one_shot)
    assert ids[:10_240] == list(range(256)) * 40 and len(ids_of(one_shot.with_suffix(".idx"), "Q")) == 301


def test_streaming_with_a_tokenizer_cuts_text_at_lines(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "</s>": 1, "alpha": 2, "beta": 3}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tok.json"))
    (tmp_path / "a.txt").write_text("alpha beta\n\n  beta\n" * 25)
    one, small = tmp_path / "one.bin", tmp_path / "small.bin"
    assert prepare(tmp_path / "a.txt", "-o", one, "--tokenizer", tmp_path / "tok.json") == 0
    assert prepare(tmp_path / "a.txt", "-o", small, "--tokenizer", tmp_path / "tok.json", "--buffer", "7") == 0
    assert small.read_bytes() == one.read_bytes()
    assert ids_of(one) == [2, 3, 3] * 25 + [1]


def test_text_pieces_for_a_tokenizer_end_where_a_word_begins(tmp_path):
    from parc.codegen.corpus import documents

    path = tmp_path / "a.txt"
    path.write_bytes(b"one two\n\n  three\nfour five six\n" * 20)
    pieces = list(next(documents(path, field="text", buffer=5, whole_lines=True)))
    assert b"".join(pieces) == path.read_bytes() and len(pieces) > 20
    for piece, after in zip(pieces, pieces[1:]):
        assert piece.endswith(b"\n") and after[:1] not in b" \t\r\n"
    assert {len(p) for p in next(documents(path, field="text", buffer=5))} == {5}  # bytes: cut anywhere
