"""`parc data prepare`: text → byte-level token file."""

import json

from parc.codegen.cli import main


def test_prepare_writes_bytes_with_separators(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"hi")
    (tmp_path / "b.txt").write_bytes("é".encode())
    out = tmp_path / "data" / "train.bin"
    assert main(["data", "prepare", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "-o", str(out)]) == 0
    raw = out.read_bytes()
    ids = [int.from_bytes(raw[i : i + 2], "little") for i in range(0, len(raw), 2)]
    assert ids == [104, 105, 256, 0xC3, 0xA9, 256]
    info = json.loads(out.with_suffix(".json").read_text())
    assert info["tokens"] == 6 and info["min_vocab"] == 257 and info["dtype"] == "uint16"


def test_prepare_uint32_without_separator(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"xyz")
    out = tmp_path / "t.bin"
    assert main(["data", "prepare", str(tmp_path / "a.txt"), "-o", str(out), "--dtype", "uint32", "--no-separator"]) == 0
    raw = out.read_bytes()
    assert [int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4)] == [120, 121, 122]


def test_prepare_refuses_to_overwrite(tmp_path, capsys):
    (tmp_path / "a.txt").write_bytes(b"x")
    out = tmp_path / "t.bin"
    out.write_bytes(b"precious")
    assert main(["data", "prepare", str(tmp_path / "a.txt"), "-o", str(out)]) == 1
    assert out.read_bytes() == b"precious"
    assert "--force" in capsys.readouterr().err


def test_prepare_missing_input_is_usage_error(tmp_path, capsys):
    assert main(["data", "prepare", str(tmp_path / "nope.txt"), "-o", str(tmp_path / "t.bin")]) == 2
    assert "cannot read" in capsys.readouterr().err
