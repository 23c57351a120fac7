"""A build folder is untrusted input (Note [a build folder is untrusted input]).

A manifest that names files outside the folder (``..``, absolute, through a symlink),
a manifest of the wrong shape, a symlinked subfolder, and an ``-o`` that is not a
folder each get one clear error, exit 1, and nothing inside or outside is touched —
``--force`` included.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from parc.codegen.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "tiny.par")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (symlinks as their targets' names), for "nothing changed"."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            out[key] = b"->" + os.readlink(path).encode()
        elif path.is_file():
            out[key] = path.read_bytes()
    return out


@pytest.fixture
def built(tmp_path):
    out = tmp_path / "build"
    assert main(["build", TINY, "-o", str(out)]) == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    return out, victim


def poison(out: Path, names: list[str], victim: Path) -> None:
    manifest = out / ".parc" / "manifest.json"
    document = json.loads(manifest.read_text())
    for name in names:
        document["files"][name] = sha(victim)
    manifest.write_text(json.dumps(document))


def refused(out: Path, victim: Path, capsys, *extra: str) -> str:
    before = snapshot(out.parent)
    for flags in ([], ["--force"], ["--check"]):
        assert main(["build", TINY, "-o", str(out), "--set", "train.steps=3", *flags, *extra]) == 1
    assert victim.read_text() == "precious"
    assert snapshot(out.parent) == before
    return capsys.readouterr().err


@pytest.mark.parametrize("name", ["../victim.txt", "parc_runtime/../../victim.txt", "./../victim.txt"])
def test_relative_escape_is_refused(built, capsys, name):
    out, victim = built
    poison(out, [name], victim)
    err = refused(out, victim, capsys)
    assert "lists a file outside the build folder" in err and "hint:" in err
    assert "Traceback" not in err


def test_absolute_path_is_refused(built, capsys):
    out, victim = built
    poison(out, [str(victim)], victim)
    err = refused(out, victim, capsys)
    assert "is an absolute path" in err


def test_symlink_leading_out_is_refused(built, capsys):
    out, victim = built
    (out / "escape").symlink_to(victim.parent)
    poison(out, ["escape/victim.txt"], victim)
    err = refused(out, victim, capsys)
    assert "leads outside the folder" in err


def test_symlinked_file_in_manifest_is_refused(built, capsys):
    out, victim = built
    (out / "notes.txt").symlink_to(victim)
    poison(out, ["notes.txt"], victim)
    err = refused(out, victim, capsys)
    assert "leads outside the folder" in err


def test_symlinked_subfolder_cannot_carry_writes_out(built, capsys, tmp_path):
    out, victim = built
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.py").write_text("mine")
    runtime = out / "parc_runtime"
    for path in sorted(runtime.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    runtime.rmdir()
    runtime.symlink_to(outside)
    err = refused(out, victim, capsys)
    assert "leads outside the folder" in err  # the manifest's parc_runtime/ entries
    # Without a manifest (an unmanaged folder, written with --force) the writes are checked too.
    (out / ".parc" / "manifest.json").unlink()
    err = refused(out, victim, capsys)
    assert "cannot write parc_runtime/" in err
    assert sorted(p.name for p in outside.iterdir()) == ["keep.py"]


def test_a_dot_parc_symlink_is_refused(built, capsys, tmp_path):
    out, victim = built
    elsewhere = tmp_path / "dotparc"
    (out / ".parc").rename(elsewhere)
    (out / ".parc").symlink_to(elsewhere)
    err = refused(out, victim, capsys)
    assert "leads outside the folder" in err


@pytest.mark.parametrize(
    "text, words",
    [
        ("[]", "is not of type 'object'"),
        ('{"files": null}', "['files']: None is not of type 'object'"),
        ('{"files": {"train.py": 3}}', "['files']['train.py']: 3 is not of type 'string'"),
        ('{"files": {"train.py": "abc"}}', "does not match"),
        ("{}", "'files' is a required property"),
        ("not json", "is not JSON: line 1 column 1: Expecting value: not a parc manifest"),
        ('{"files": {}, "spec_sha256": NaN}', "not JSON parc accepts"),
        ('{"files": {"": "' + "0" * 64 + '"}}', "is not a file name"),
        ('{"files": {"a\\\\b": "' + "0" * 64 + '"}}', "backslash"),
    ],
)
def test_manifest_of_the_wrong_shape(built, capsys, text, words):
    out, victim = built
    (out / ".parc" / "manifest.json").write_text(text)
    err = refused(out, victim, capsys)
    assert words in err, err
    assert err.count("manifest.json") >= 1 and "Traceback" not in err


def test_binary_manifest(built, capsys):
    out, victim = built
    (out / ".parc" / "manifest.json").write_bytes(b"\xff\xfe\x00garbage")
    err = refused(out, victim, capsys)
    assert "is not UTF-8 text" in err and "not a parc manifest" in err


def test_a_fifo_manifest_does_not_hang_the_build(built, capsys):
    out, victim = built
    manifest = out / ".parc" / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)
    err = refused(out, victim, capsys)
    assert "not a parc manifest" in err and "regular file" in err


def test_output_is_a_file(tmp_path, capsys):
    target = tmp_path / "file.txt"
    target.write_text("mine")
    assert main(["build", TINY, "-o", str(target)]) == 1
    assert "exists and is not a folder" in capsys.readouterr().err
    assert target.read_text() == "mine"


def test_output_is_dev_null(capsys):
    assert main(["build", TINY, "-o", "/dev/null"]) == 1
    assert "/dev/null exists and is not a folder" in capsys.readouterr().err


def test_output_is_a_dangling_symlink(tmp_path, capsys):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    assert main(["build", TINY, "-o", str(link)]) == 1
    assert "is a symlink to nothing" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()


def test_output_under_a_file(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("mine")
    assert main(["build", TINY, "-o", str(tmp_path / "file.txt" / "sub" / "build")]) == 1
    assert "file.txt is a file, not a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_output_in_a_read_only_folder(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert main(["build", TINY, "-o", str(locked / "build")]) == 1
        assert "is not writable" in capsys.readouterr().err
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize("blocker", ["parc_runtime", "train.py"])
def test_a_file_or_folder_in_the_way_is_found_before_writing(built, capsys, blocker):
    out, victim = built
    target = out / blocker
    if target.is_dir():
        for path in sorted(target.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        target.rmdir()
        target.write_text("a file where a folder belongs")
    else:
        target.unlink()
        target.mkdir()
    (out / ".parc" / "manifest.json").unlink()
    err = refused(out, victim, capsys)
    assert "is a file, not a folder" in err or "a folder is in its place" in err


def test_a_good_rebuild_still_removes_only_its_own_files(built):
    out, victim = built
    (out / "mine.txt").write_text("user")
    assert main(["build", TINY, "-o", str(out), "--set", "train.steps=3"]) == 0
    assert (out / "mine.txt").read_text() == "user" and victim.read_text() == "precious"
