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
