"""Every flag of a generated ``train.py`` checks its value as argparse reads it
(codegen/render_flags.py, runtime/train/flags.py): a value out of range is a usage error that
names the flag (exit 2, no traceback), before anything starts."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from parc.codegen.build import build_to

ROOT = Path(__file__).resolve().parents[2]
# the build with the most flags: a token file with a validation file (--data, --val-data)
SETS = ['train.data=tokens("x.bin", val = "v.bin")', "train.eval=every(2, batches = 1)"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    spec = tmp_path_factory.mktemp("spec") / "tiny.par"
    spec.write_text((ROOT / "examples" / "tiny.par").read_text())
    return build_to(spec, tmp_path_factory.mktemp("build") / "tiny", SETS)


@pytest.fixture(scope="module")
def parse_args(folder):
    """The build's own ``parse_args``, its ``parc_runtime`` imported from the folder."""
    saved = {n: m for n, m in sys.modules.items() if n.split(".")[0] == "parc_runtime"}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location("built_train", folder / "train.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module.parse_args
    finally:
        sys.path.remove(str(folder))
        for name in [n for n in sys.modules if n.split(".")[0] == "parc_runtime"]:
            del sys.modules[name]
        sys.modules.update(saved)


def test_every_flag_has_a_checking_type(folder):
    tree = ast.parse((folder / "train.py").read_text())
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "parse_args")
    calls = [n for n in ast.walk(function) if isinstance(n, ast.Call) and ast.unparse(n.func) == "parser.add_argument"]
    switches = [call.args[0].value for call in calls  # a switch takes no value to check
                if any(k.arg == "action" and ast.unparse(k.value) == "'store_true'" for k in call.keywords)]
    flags = {call.args[0].value: ast.unparse(next(k.value for k in call.keywords if k.arg == "type"))
             for call in calls if any(k.arg == "type" for k in call.keywords)}
    assert switches == ["--eval-only"]
    assert len(flags) + len(switches) == len(calls) == 15, [ast.unparse(c) for c in calls]
    assert all(kind.startswith("flags.") for kind in flags.values()), flags


BAD = [
    (["--steps", "-3"], "argument --steps: must be at least 1, got -3"),
    (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
    (["--steps", "2147483648"], "argument --steps: must be at most 2147483647, got 2147483648"),
    (["--steps", "3.5"], "argument --steps: expects a whole number, got '3.5'"),
    (["--seed", "-1"], "argument --seed: must be at least 0, got -1"),
    (["--seed", "4294967296"], "argument --seed: must be at most 4294967295, got 4294967296"),
    (["--checkpoint-every", "-2"], "argument --checkpoint-every: must be at least 0, got -2"),
    (["--checkpoint-keep", "-1"], "argument --checkpoint-keep: must be at least 0, got -1"),
    (["--memory-every", "-5"], "argument --memory-every: must be at least 0, got -5"),
    (["--profile", "0"], "argument --profile: '0': steps are counted from 1 and A-B needs A <= B"),
    (["--profile", "5-3"], "argument --profile: '5-3': steps are counted from 1 and A-B needs A <= B"),
    (["--profile", "x"], "argument --profile: 'x': expected a step N or a range A-B such as 3-5"),
    (["--metrics-jsonl", ""], "argument --metrics-jsonl: expects a path, got an empty string"),
    (["--checkpoint-dir", "a\nb"], "argument --checkpoint-dir: 'a\\nb' holds the control character U+000A"),
    (["--resume", ""], "argument --resume: expects a path, got an empty string"),
    (["--init-from", ""], "argument --init-from: expects a path, got an empty string"),
    (["--tensorboard", "\t"], "argument --tensorboard: '\\t' holds the control character U+0009"),
    (["--profile-dir", ""], "argument --profile-dir: expects a path, got an empty string"),
    (["--data", ""], "argument --data: expects a path, got an empty string"),
    (["--val-data", "v\x7f.bin"], "argument --val-data: 'v\\x7f.bin' holds the control character U+007F"),
]


@pytest.mark.parametrize("argv, words", BAD, ids=[" ".join(a).strip() or a[0] for a, _ in BAD])
def test_a_value_out_of_range_is_a_usage_error(parse_args, monkeypatch, capsys, argv, words):
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    with pytest.raises(SystemExit) as exc:
        parse_args()
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"train.py: error: {words}"


def test_values_in_range_are_read(parse_args, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", "--steps", "1", "--seed", "0", "--checkpoint-every", "0",
                                      "--memory-every", "0", "--profile", "2-3", "--checkpoint-keep", "3"])
    args = parse_args()
    assert (args.steps, args.seed, args.checkpoint_every, args.memory_every, args.profile, args.checkpoint_keep) == (
        1, 0, 0, 0, "2-3", 3)


def test_the_trainer_itself_exits_2_without_a_traceback(folder):
    done = subprocess.run([sys.executable, "train.py", "--steps", "-3"], cwd=folder, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == "train.py: error: argument --steps: must be at least 1, got -3"
    assert "Traceback" not in done.stderr and done.stdout == ""
