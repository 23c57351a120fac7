"""Every file or folder parc reads or writes for a user: a bad one is one diagnostic, never a trace.

Each case runs the CLI (``parc.codegen.cli.main``) on a bad input and checks the exit
status (1, or 2 for a missing file), the words of the message, that no ``Traceback``
was printed, and that nothing was written or changed. Covered: profiles (``parc
plan``/``parc build`` through ``mesh.profile``, validated by ``PROFILE_SCHEMA``),
``parc export``'s checkpoint and OUT, ``parc data prepare``'s inputs and output,
``parc profile -o`` and ``parc explain -o``. The trainer's side (``--resume``,
``--checkpoint-dir``, token files, ``--metrics-jsonl``) is in
``tests/checkpoint/test_bad_files.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from parc.codegen.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = (ROOT / "examples" / "tiny.par").read_text()
PROFILE = {
    "version": 1, "device": "cpu", "ranks": 1, "cores": 2,
    "matmul": [{"n": 32, "flops": 1e9}, {"n": 64, "flops": 2e9}, {"n": 128, "flops": 4e9}],
    "memory_bandwidth": 1e10, "op_overhead_s": 1e-5, "memory_bytes": 8e9, "collectives": {},
    "elementwise": {"eager": {"gelu": 6e-8}},
}


def spec_naming(tmp_path: Path, profile: str = "machine.json") -> Path:
    spec = tmp_path / "p.par"
    spec.write_text(TINY.replace("  device = cpu\n", f'  device = cpu\n  profile = "{profile}"\n'))
    return spec


def plan_error(tmp_path, capsys, *, exit_code: int = 1) -> str:
    spec = spec_naming(tmp_path)
    assert main(["plan", str(spec), "--set", "parallel=auto"]) == exit_code
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err
    line = next(i for i, text in enumerate(spec.read_text().splitlines(), 1) if "profile" in text)
    assert err.startswith(f"{spec}:{line}:13: error[PAR0804]"), err
    return err.splitlines()[0]


# ---- profiles ---------------------------------------------------------------------


def test_a_good_profile_plans(tmp_path, capsys):
    (tmp_path / "machine.json").write_text(json.dumps(PROFILE))
    assert main(["plan", str(spec_naming(tmp_path)), "--set", "parallel=auto"]) == 0
    assert "profile machine.json" in capsys.readouterr().out


@pytest.mark.parametrize("change, problem", [
    (lambda p: p.update(matmul={"n": 32, "flops": 1e9}), '["matmul"]: must be a list ([...]), not {"n": 32'),
    (lambda p: p["matmul"][2].update(flops=0), '["matmul"][2]["flops"]: must be > 0, not 0'),
    (lambda p: p["matmul"][1].update(n=-64), '["matmul"][1]["n"]: must be > 0, not -64'),
    (lambda p: p["matmul"][0].update(flops="fast"), '["matmul"][0]["flops"]: must be a number, not "fast"'),
    (lambda p: p.update(memory_bandwidth=True), '["memory_bandwidth"]: must be a number, not true'),
    (lambda p: p.update(op_overhead_s=0.0), '["op_overhead_s"]: must be > 0, not 0.0'),
    (lambda p: p.update(cores=0), '["cores"]: must be >= 1, not 0'),
    (lambda p: p.update(matmul=[]), '["matmul"]: must have at least 1 entry'),
    (lambda p: p.pop("memory_bandwidth"), 'the document: "memory_bandwidth" is missing'),
    (lambda p: p.update(collectives={"all_reduce": {"ranks": 2, "latency_s": 1e-4, "bandwidth": 0}}),
     '["collectives"]["all_reduce"]["bandwidth"]: must be > 0, not 0'),
    (lambda p: p.update(elementwise={"eager": {"gelu": -1}}), '["elementwise"]["eager"]["gelu"]: must be > 0'),
    (lambda p: p["matmul"][1].update(n=32), '["matmul"]: two rows have the same n'),
])
def test_a_bad_profile_names_the_file_and_the_json_path(tmp_path, capsys, change, problem):
    profile = json.loads(json.dumps(PROFILE))
    change(profile)
    (tmp_path / "machine.json").write_text(json.dumps(profile))
    line = plan_error(tmp_path, capsys)
    assert f"{tmp_path / 'machine.json'} is not a parc profile: {problem}" in line


@pytest.mark.parametrize("text, problem", [
    ('{"matmul": [{"n": 32, "flops": NaN}]}', "is not JSON parc accepts: NaN is not a number JSON allows"),
    ('{"matmul": [{"n": 32, "flops": Infinity}]}', "is not JSON parc accepts: Infinity is not a number"),
    ('{"matmul": [{"n": 32, "flops": 1e999}]}', "is not JSON parc accepts: 1e999 is too large for a number"),
    ("[1, 2", "is not JSON: line 1 column 6"),
])
def test_a_profile_that_is_not_json_parc_accepts(tmp_path, capsys, text, problem):
    (tmp_path / "machine.json").write_text(text)
    line = plan_error(tmp_path, capsys)
    assert f"cannot read the profile: {tmp_path / 'machine.json'} {problem}" in line


def test_profile_paths_that_are_not_a_readable_file(tmp_path, capsys):
    target = tmp_path / "machine.json"
    cases = {
        "is a folder, not a file": lambda: target.mkdir(),
        "is a symlink to nothing": lambda: target.symlink_to(tmp_path / "gone.json"),
        "is not a regular file (a device, pipe or socket)": lambda: target.symlink_to("/dev/zero"),
        "is not UTF-8 text (byte 0xff at offset 1)": lambda: target.write_bytes(b"{\xff}"),
        "is larger than the 64 MiB parc reads of it": lambda: _sparse(target, 65 * 2**20),
        ": no such file": lambda: None,
    }
    for problem, make in cases.items():
        make()
        assert problem in plan_error(tmp_path, capsys), problem
        if target.is_dir() and not target.is_symlink():
            target.rmdir()
        elif target.exists() or target.is_symlink():
            target.unlink()


def test_build_quotes_a_bad_profile_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "machine.json").write_text(json.dumps(dict(PROFILE, op_overhead_s=-1)))
    out = tmp_path / "out"
    assert main(["build", str(spec_naming(tmp_path)), "-o", str(out), "--set", "parallel=auto"]) == 1
    err = capsys.readouterr().err
    assert '["op_overhead_s"]: must be > 0, not -1' in err and "Traceback" not in err
    assert not out.exists()


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as handle:
        handle.truncate(size)


# ---- parc export: the checkpoint -------------------------------------------------

MODEL = {"arch": "gpt", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn": 256, "vocab": 250,
         "padded_vocab": 256, "seq_len": 32, "dropout": 0.0, "norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_embeddings": True}
INFO = {"format": 1, "step": 1, "optimizer_step": 1, "world_size": 1, "samples_seen": 4, "layout": "one rank",
        "model": MODEL}


def fake_checkpoint(folder: Path, info=INFO, index: bytes = b"not a pickle") -> Path:
    step = folder / "step_000001"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(index)
    (step / "parc.json").write_text(info if isinstance(info, str) else json.dumps(info))
    return step


def export(capsys, ckpt, out, *extra) -> tuple[int, str]:
    status = main(["export", str(ckpt), "--to", "safetensors", str(out), *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return status, err.strip()


def with_model(**changes) -> dict:
    return dict(INFO, model=dict(MODEL, **changes))


@pytest.mark.parametrize("info, problem", [
    ("[1, 2]", "parc.json: must be an object, not list"),
    ("{oops", "parc.json is not JSON: line 1 column 2"),
    (dict(INFO, step="1"), "parc.json: [\"step\"]: must be a whole number, not '1'"),
    (dict(INFO, world_size=0), "parc.json: [\"world_size\"]: must be >= 1, not 0"),
    (dict(INFO, format=2), "checkpoint format 2, expected 1"),
    ({k: v for k, v in INFO.items() if k != "layout"}, "parc.json: [\"layout\"] is missing"),
    (with_model(heads="4"), "parc.json: [\"model\"][\"heads\"]: must be a whole number, not '4'"),
    (with_model(tie_embeddings=1), "parc.json: [\"model\"][\"tie_embeddings\"]: must be true or false, not 1"),
    (with_model(heads=0), "parc.json: [\"model\"][\"heads\"]: must be >= 1, not 0"),
    (with_model(heads=3), "parc.json: [\"model\"]: ModelConfig: hidden = 64 is not divisible by heads = 3"),
    (with_model(arch="bert"), "parc.json: [\"model\"]: ModelConfig: arch must be 'gpt' or 'llama'"),
])
def test_export_of_a_bad_parc_json(tmp_path, capsys, info, problem):
    step = fake_checkpoint(tmp_path / "ck", info)
    status, err = export(capsys, tmp_path / "ck", tmp_path / "out")
    assert status == 1 and err.startswith("parc export: ") and problem in err, err
    assert str(step) in err
    assert not (tmp_path / "out").exists()


def test_export_of_a_damaged_index(tmp_path, capsys):
    step = fake_checkpoint(tmp_path / "ck")
    status, err = export(capsys, tmp_path / "ck", tmp_path / "out")
    assert status == 1 and err == f"parc export: {step}/.metadata is not a DCP index: UnpicklingError: " + (
        "invalid load key, 'n'.")
    assert not (tmp_path / "out").exists()


def test_export_checkpoint_paths_that_are_not_checkpoints(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "empty").mkdir()
    fake_checkpoint(tmp_path / "elsewhere")
    (tmp_path / "leading_out").mkdir()
    (tmp_path / "leading_out" / "step_000009").symlink_to(tmp_path / "elsewhere" / "step_000001")
    cases = {
        "file": (1, f"parc export: {tmp_path / 'file'} is a file, not a checkpoint folder"),
        "dangling": (1, f"parc export: {tmp_path / 'dangling'} is a symlink to nothing ({tmp_path / 'gone'})"),
        "empty": (2, f"parc export: {tmp_path / 'empty'}: no complete checkpoint there"),
        "missing": (2, f"parc export: {tmp_path / 'missing'}: no such checkpoint folder"),
        "leading_out": (1, f"parc export: {tmp_path / 'leading_out'}: 'step_000009' leads outside the folder"),
    }
    for name, (code, words) in cases.items():
        status, err = export(capsys, tmp_path / name, tmp_path / "out")
        assert status == code and err.startswith(words), (name, err)
    assert not (tmp_path / "out").exists()


# ---- parc export: OUT ------------------------------------------------------------


def test_export_never_overwrites_or_writes_through_a_bad_out(tmp_path, capsys):
    ckpt = tmp_path / "ck"
    fake_checkpoint(ckpt)
    (tmp_path / "mine.safetensors").write_bytes(b"precious")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").write_text("precious")
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling.safetensors").symlink_to(tmp_path / "gone")
    cases = {
        tmp_path / "mine.safetensors": f"{tmp_path / 'mine.safetensors'} exists: remove it, or pass --force",
        tmp_path / "folder": f"{tmp_path / 'folder' / 'config.json'} exists: remove it, or pass --force",
        tmp_path / "file" / "out.safetensors": f"cannot make {tmp_path / 'file' / 'out.safetensors'}: "
                                               f"{tmp_path / 'file'} is a file, not a folder",
        tmp_path / "dangling.safetensors": "dangling.safetensors is a symlink to nothing",
        Path("/dev/null"): "/dev/null exists and is not a folder",
        tmp_path / "file": f"{tmp_path / 'file'} exists and is not a folder",
    }
    for out, words in cases.items():
        for extra in ((), ("--force",)) if "exists:" not in words else ((),):
            status, err = export(capsys, ckpt, out, *extra)
            assert status == 1 and words in err, (out, err)
    assert (tmp_path / "mine.safetensors").read_bytes() == b"precious"
    assert (tmp_path / "folder" / "config.json").read_text() == "precious"
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == ["config.json"]
    # --force lifts only "exists": the checkpoint is then read (and here found damaged)
    status, err = export(capsys, ckpt, tmp_path / "mine.safetensors", "--force")
    assert status == 1 and "is not a DCP index" in err
    assert (tmp_path / "mine.safetensors").read_bytes() == b"precious"


# ---- parc data prepare -------------------------------------------------------------


def prepare(capsys, *args) -> tuple[int, str]:
    status = main(["data", "prepare", *map(str, args)])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return status, err.strip()


def test_prepare_inputs_that_are_not_readable_files(tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    (tmp_path / "dangling.txt").symlink_to(tmp_path / "gone.txt")
    out = tmp_path / "t.bin"
    cases = {
        # a folder is an input now (its .txt/.jsonl/.json files): an empty one says what it lacks
        tmp_path / "folder": (1, f"parc data prepare: {tmp_path / 'folder'} is a folder with no .txt, .jsonl or .json file"),
        tmp_path / "dangling.txt": (1, f"parc data prepare: {tmp_path / 'dangling.txt'} is a symlink to nothing"),
        Path("/dev/zero"): (1, "parc data prepare: /dev/zero is not a regular file (a device, pipe or socket)"),
        tmp_path / "nope.txt": (2, f"parc data prepare: cannot read {tmp_path / 'nope.txt'}: no such file"),
    }
    for text, (code, words) in cases.items():
        status, err = prepare(capsys, text, "-o", out)
        assert status == code and err.startswith(words), (text, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.txt", "folder"]


def test_prepare_outputs_that_cannot_be_written(tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_text("hello")
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder.bin").mkdir()
    (tmp_path / "dangling.bin").symlink_to(tmp_path / "gone.bin")
    (tmp_path / "t.json").write_text("precious")
    cases = {
        tmp_path / "file" / "t.bin": f"cannot make {tmp_path / 'file' / 't.bin'}: {tmp_path / 'file'} is a file",
        tmp_path / "folder.bin": f"{tmp_path / 'folder.bin'} is a folder, not a file",
        tmp_path / "dangling.bin": f"{tmp_path / 'dangling.bin'} is a symlink to nothing",
        Path("/dev/null"): "/dev/null is not a regular file",
        tmp_path / "t.bin": f"{tmp_path / 't.json'} exists; pass --force to overwrite it",  # the .json beside it
        tmp_path / "x.json": "name the token file OUT.bin",
    }
    for out, words in cases.items():
        status, err = prepare(capsys, text, "-o", out)
        assert status == 1 and words in err, (out, err)
    assert (tmp_path / "t.json").read_text() == "precious" and not (tmp_path / "t.bin").exists()
    assert not list(tmp_path.glob(".*parc-tmp")) and not (tmp_path / "gone.bin").exists()
    status, _ = prepare(capsys, text, "-o", tmp_path / "t.bin", "--force")
    assert status == 0 and json.loads((tmp_path / "t.json").read_text())["tokens"] == 6


# ---- parc profile -o, parc explain -o ------------------------------------------------


def test_profile_output_is_checked_before_measuring(tmp_path, capsys):
    (tmp_path / "notes.json").write_text("my notes")
    (tmp_path / "folder").mkdir()
    cases = {
        tmp_path / "notes.json": f"{tmp_path / 'notes.json'} exists and is not a parc profile: remove it",
        tmp_path / "folder": f"{tmp_path / 'folder'} is a folder, not a file",
        tmp_path / "notes.json" / "p.json": f"{tmp_path / 'notes.json'} is a file, not a folder",
        Path("/dev/null"): "/dev/null is not a regular file",
    }
    for out, words in cases.items():
        assert main(["profile", "--ranks", "1", "-o", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("parc profile: ") and words in err and "Traceback" not in err, err
    assert (tmp_path / "notes.json").read_text() == "my notes"


def test_explain_output_folder_is_checked(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "svg" / "schedule.svg").mkdir(parents=True)
    spec = str(ROOT / "examples" / "tiny.par")
    cases = {
        tmp_path / "file": f"{tmp_path / 'file'} exists and is not a folder",
        tmp_path / "file" / "sub": f"{tmp_path / 'file'} is a file, not a folder",
        Path("/dev/null"): "/dev/null exists and is not a folder",
        tmp_path / "svg": f"{tmp_path / 'svg' / 'schedule.svg'} is a folder, not a file",
    }
    for out, words in cases.items():
        assert main(["explain", spec, "--set", "parallel.dp=1", "--set", "parallel.pp=2", "-o", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("parc explain: ") and words in err and "Traceback" not in err, err
    assert (tmp_path / "file").read_text() == "x"
