"""``parc check``, ``parc fmt`` and ``parc schema`` as a user runs them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from parc.codegen.cli import main
from parc.dsl.commands import load_or_report

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.par"
MESSY = "mesh {\n    nodes=1\n  devices_per_node = 4 # four\n}\n"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_check_clean(capsys) -> None:
    status, out, err = run(capsys, "check", str(TINY))
    assert (status, out, err) == (0, f"{TINY}: ok\n", "")


def test_check_every_example(capsys) -> None:
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.par"))
    status, out, _ = run(capsys, "check", *examples)
    assert status == 0 and out == "".join(f"{p}: ok\n" for p in examples)


def test_check_errors_exit_1(capsys, tmp_path) -> None:
    spec = tmp_path / "bad.par"
    spec.write_text(TINY.read_text().replace("global_batch = 16", "global_batch = 15"))
    status, out, err = run(capsys, "check", str(spec))
    assert (status, out) == (1, "")
    assert err == (
        f"{spec}:27:18: error[PAR0208]: global_batch = 15 is not divisible by "
        "micro_batch·dp = 2·2 = 4\n"
        "  27 |   global_batch = 15\n"
        "     |                  ^^\n"
        "  hint: global_batch = micro_batch · grad_accum · dp: try global_batch = 12 or 16\n"
        "\n"
        "1 error\n"
    )


def test_check_set(capsys) -> None:
    status, out, err = run(capsys, "check", str(TINY), "--set", "parallel.tp=3")
    assert status == 1 and out == ""
    assert err.startswith("--set 1:1:13: error[PAR0201]: world size: dp·tp·pp = 2·3·1 = 6")
    assert "  1 | parallel.tp=3\n    |             ^\n" in err
    assert err.endswith("\n2 errors\n")
    status, out, _ = run(
        capsys, "check", str(TINY), "--set", "parallel.tp=1", "--set", "parallel.dp=4"
    )
    assert (status, out) == (0, f"{TINY}: ok\n")


def test_check_warns_of_a_token_file_made_for_a_larger_vocab(capsys, tmp_path) -> None:
    # `parc data prepare` records min_vocab = 257 (ids 0..255 and the separator 256)
    # in train.json beside train.bin; a model of vocab 200 would stop at its first step.
    (tmp_path / "a.txt").write_text("hello")
    assert main(["data", "prepare", str(tmp_path / "a.txt"), "-o", str(tmp_path / "data" / "train.bin")]) == 0
    capsys.readouterr()
    spec = tmp_path / "tiny.par"
    text = TINY.read_text().replace("vocab = 512", "vocab = 200")
    spec.write_text(text.replace("data = synthetic", 'data = tokens("data/train.bin")'))
    status, out, err = run(capsys, "check", str(spec))
    assert (status, out) == (0, f"{spec}: ok\n")  # a warning: the command goes on
    assert err == (
        f"{spec}:34:10: warning[PAR0218]: data/train.bin holds token ids up to 256 "
        f"({tmp_path}/data/train.json says min_vocab = 257), but the model's vocab is 200: "
        "the trainer would stop at its first step\n"
        '  34 |   data = tokens("data/train.bin")\n'
        "     |          ^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "  hint: set model.vocab to at least 257\n"
        "\n"
        "1 warning\n"
    )
    status, out, err = run(capsys, "check", str(spec), "--set", "model.vocab=257")
    assert (status, out, err) == (0, f"{spec}: ok\n", "")


def test_check_warns_of_a_missing_token_file_relative_to_the_spec(capsys, tmp_path) -> None:
    status, out, err = run(capsys, "check", str(TINY), "--set", 'train.data=tokens("nope.bin")')
    assert (status, out) == (0, f"{TINY}: ok\n")
    assert err.startswith(f"--set 1:1:12: warning[PAR0219]: no token file at {TINY.parent}/nope.bin\n")
    assert err.endswith("\n1 warning\n")


def test_check_warns_of_separate_documents_without_an_idx(capsys, tmp_path) -> None:
    tokens = tmp_path / "corpus.bin"
    tokens.write_bytes(bytes(64))
    sets = ("--set", f'train.data=tokens("{tokens}")', "--set", "model.documents=separate")
    status, out, err = run(capsys, "check", str(TINY), *sets)
    assert (status, out) == (0, f"{TINY}: ok\n")
    assert err.startswith(f"--set 1:1:12: warning[PAR0225]: model.documents = separate reads each document's "
                          f"start from {tmp_path}/corpus.idx, which is not there\n")
    (tmp_path / "corpus.idx").write_bytes(bytes(8))
    assert run(capsys, "check", str(TINY), *sets) == (0, f"{TINY}: ok\n", "")


def test_a_set_micro_batch_that_breaks_the_batch_is_shown_at_the_set(capsys) -> None:
    status, out, err = run(capsys, "check", str(TINY), "--set", "train.micro_batch=3")
    assert (status, out) == (1, "")
    assert err == (
        "--set 1:1:19: error[PAR0208]: global_batch = 16 is not divisible by micro_batch·dp = 3·2 = 6\n"
        "  1 | train.micro_batch=3\n"
        "    |                   ^\n"
        "  hint: global_batch = micro_batch · grad_accum · dp: try global_batch = 12 or 18, "
        "or micro_batch = 1, 2, 4, 8\n"
        "\n"
        "1 error\n"
    )


def test_check_missing_file_exits_2(capsys, tmp_path) -> None:
    missing = tmp_path / "nope.par"
    status, out, err = run(capsys, "check", str(missing), str(TINY))
    assert status == 2
    assert err == f"parc: error: cannot read {missing}: No such file or directory\n"
    assert out == f"{TINY}: ok\n"


def test_check_a_directory_exits_2(capsys, tmp_path) -> None:
    status, _, err = run(capsys, "check", str(tmp_path))
    assert status == 2 and err.startswith("parc: error: cannot read")


def test_usage_error_exits_2(capsys) -> None:
    assert main(["check"]) == 2  # no FILE (and no --matrix)
    assert "give a spec FILE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:  # argparse's own
        main(["check", "--no-such-flag"])
    assert caught.value.code == 2


def test_fmt_check_and_diff(capsys, tmp_path) -> None:
    spec = tmp_path / "m.par"
    spec.write_text(MESSY)
    status, out, err = run(capsys, "fmt", "--check", str(spec))
    assert (status, out, err) == (1, "", f"would reformat {spec}\n")
    status, out, err = run(capsys, "fmt", "--diff", str(spec))
    assert status == 0 and err == ""
    assert out == (
        f"--- {spec}\n+++ {spec} (formatted)\n@@ -1,4 +1,4 @@\n mesh {{\n"
        "-    nodes=1\n-  devices_per_node = 4 # four\n"
        "+  nodes = 1\n+  devices_per_node = 4  # four\n }\n"
    )
    assert spec.read_text() == MESSY  # --check and --diff write nothing
    status, out, err = run(capsys, "fmt", "--stdout", str(spec))
    assert (status, out, err) == (0, "mesh {\n  nodes = 1\n  devices_per_node = 4  # four\n}\n", "")
    assert spec.read_text() == MESSY  # nor does --stdout
    status, out, err = run(capsys, "fmt", str(spec))
    assert (status, err) == (0, f"reformatted {spec}\n")
    assert spec.read_text() == "mesh {\n  nodes = 1\n  devices_per_node = 4  # four\n}\n"
    assert run(capsys, "fmt", "--check", str(spec)) == (0, "", "")


def test_fmt_examples_are_clean(capsys) -> None:
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.par"))
    assert run(capsys, "fmt", "--check", *examples) == (0, "", "")


def test_fmt_never_clobbers_a_file_that_does_not_parse(capsys, tmp_path) -> None:
    spec = tmp_path / "broken.par"
    text = "mesh {\n  nodes = 1\n"
    spec.write_text(text)
    status, out, err = run(capsys, "fmt", str(spec))
    assert status == 1 and "error[PAR0005]: missing `}`" in err
    assert spec.read_text() == text
    assert [p.name for p in tmp_path.iterdir()] == ["broken.par"]


def test_fmt_keeps_permissions(capsys, tmp_path) -> None:
    spec = tmp_path / "m.par"
    spec.write_text(MESSY)
    spec.chmod(0o640)
    run(capsys, "fmt", str(spec))
    assert spec.stat().st_mode & 0o777 == 0o640


def test_fmt_missing_file_and_json(capsys, tmp_path) -> None:
    status, _, err = run(capsys, "fmt", str(tmp_path / "nope.par"))
    assert status == 2 and err.startswith("parc: error: cannot read")
    status, _, err = run(capsys, "fmt", str(tmp_path / "x.json"))
    assert status == 2 and "not JSON" in err


def test_schema(capsys) -> None:
    status, out, err = run(capsys, "schema")
    assert status == 0 and err == ""
    printed = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(printed)
    assert printed["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_check_a_json_spec(capsys, tmp_path) -> None:
    from parc.dsl.normalize import normalize_document
    from parc.dsl.parse import parse

    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(normalize_document(parse(TINY.read_text(), "t.par")).doc, indent=2))
    assert run(capsys, "check", str(spec)) == (0, f"{spec}: ok\n", "")


def test_load_or_report(tmp_path) -> None:
    stream = io.StringIO()
    assert load_or_report(str(TINY), (), stream).model.name == "gpt_tiny"
    assert load_or_report(str(TINY), ["parallel.tp=3"], stream) is None
    assert stream.getvalue().endswith("2 errors\n")
    stream = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        load_or_report(str(tmp_path / "nope.par"), (), stream)
    assert caught.value.code == 2
    assert (
        stream.getvalue()
        == f"parc: error: cannot read {tmp_path / 'nope.par'}: No such file or directory\n"
    )


def test_no_traceback_reaches_the_user(tmp_path) -> None:
    """The real command line on hostile input: diagnostics, never a traceback."""
    hostile = tmp_path / "hostile.par"
    hostile.write_bytes(b'\x00\x1b[31m model "\xff {{{ ((( [[[ 1e999999 \\u{d800}\n' * 3)
    deep = tmp_path / "deep.par"
    deep.write_text("model m {\n  a = " + "(" * 100000 + "\n}\n")
    done = subprocess.run(
        [sys.executable, "-m", "parc.codegen.cli", "check", str(hostile), str(deep)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert "\x1b" not in done.stderr  # control characters in quoted lines are masked
    assert "error[PAR0001]" in done.stderr and "error[PAR0010]" in done.stderr


def test_check_warns_of_a_missing_init_checkpoint_relative_to_the_spec(capsys, tmp_path) -> None:
    status, out, err = run(capsys, "check", str(TINY), "--set", 'train.init=checkpoint("nope")')
    assert (status, out) == (0, f"{TINY}: ok\n")
    assert err.startswith(f"--set 1:1:12: warning[PAR0224]: nothing at {TINY.parent}/nope (a folder with "
                          "parc.json, or step_* checkpoints)\n")
    assert err.endswith("\n1 warning\n")
    (tmp_path / "ck" / "step_000004").mkdir(parents=True)
    status, out, err = run(capsys, "check", str(TINY), "--set", f'train.init=checkpoint("{tmp_path / "ck"}")')
    assert (status, out, err) == (0, f"{TINY}: ok\n", "")
