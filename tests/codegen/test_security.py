"""A spec can never inject code into the trainer (DESIGN §8).

A corpus of hostile specs — quotes, newlines, ``__import__('os')``, keywords,
look-alike Unicode, huge numbers — is either rejected with a diagnostic, or compiles
to inert code: the generated ``train.py`` parses, uses only the names the ordinary
build uses, calls nothing dangerous, and carries the hostile text only as string
constants of exactly the written value. Some accepted cases are run, and the
sentinel file their text names must not appear. Specs that bypass the front end
(``dataclasses.replace`` on a loaded ``Spec``) get the same treatment.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from parc.codegen.build import generate, write
from parc.dsl import load_text
from parc.dsl.diagnostics import Diagnostics

ROOT = Path(__file__).resolve().parents[2]
TINY = (ROOT / "examples" / "tiny.par").read_text()
ONE_RANK = ["parallel.dp=1", "parallel.tp=1", "mesh.devices_per_node=1"]
DANGEROUS_CALLS = {"eval", "exec", "__import__", "compile", "open", "system", "popen", "getattr", "setattr"}


def names_of(source: str) -> set[str]:
    tree = ast.parse(source)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(alias.name for alias in node.names)
            if isinstance(node, ast.ImportFrom):
                found.add(node.module or "")
    return found


def constants_of(source: str) -> set:
    return {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant)}


def train_py(files) -> str:
    return files["train.py"].decode()


ALLOWED = names_of(train_py(generate(load_text(TINY, "tiny.par"))))
ALLOWED |= names_of(train_py(generate(load_text(TINY, "tiny.par", ONE_RANK))))
ALLOWED |= names_of(train_py(generate(load_text(TINY, "tiny.par", ['train.data=tokens("x.bin")']))))
ALLOWED |= names_of(train_py(generate(load_text(TINY, "tiny.par", ["train.precision=bf16"]))))


def assert_inert(source: str, *, must_contain: tuple[str, ...] = ()) -> None:
    tree = ast.parse(source)
    extra = names_of(source) - ALLOWED
    assert not extra, f"names outside the allow-list: {sorted(extra)}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            assert called not in DANGEROUS_CALLS, f"generated code calls {called}"
    constants = constants_of(source)
    for text in must_contain:
        assert text in constants, f"{text!r} is not emitted as an exact string constant"


def outcome(text: str, overrides=()):
    """("rejected", errors) or ("built", files); any other exception fails the test."""
    try:
        spec = load_text(text, "hostile.par", list(overrides))
    except Diagnostics as exc:
        return "rejected", exc.errors
    try:
        return "built", generate(spec)
    except Diagnostics as exc:
        return "rejected", exc.errors


HOSTILE_PATHS = [
    'x"); import os; os.system("touch SENTINEL"); ("',
    "x'); __import__('os').system('touch SENTINEL') #",
    '""" + __import__("os").system("touch SENTINEL") + """',
    "a\\\\b\\\\SENTINEL.bin",
    "café/дата/SENTINEL.bin",
]


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_hostile_token_paths_are_inert_constants(path):
    literal = path.replace("\\", "\\\\").replace('"', '\\"') if "\\\\" not in path else path
    kind, result = outcome(TINY, [f'train.data=tokens("{literal}")'])
    if kind == "rejected":
        assert result and all(e.code.startswith("PAR") for e in result)
        return
    source = train_py(result)
    written = load_text(TINY, "t.par", [f'train.data=tokens("{literal}")']).train.data.path
    assert_inert(source, must_contain=(written,))


@pytest.mark.parametrize(
    "name",
    ["os.system", "__import__", "class", "import", "match", "x;y", "gрt_tiny", "ｇpt", "a\u200bb", "print(1)"],
)
def test_hostile_model_names_are_rejected_or_plain(name):
    text = TINY.replace("model gpt_tiny {", f"model {name} {{")
    kind, result = outcome(text)
    if kind == "built":
        assert name.isascii() and name.isidentifier()
        assert_inert(train_py(result))
    else:
        assert result and all(e.code.startswith("PAR") for e in result)


@pytest.mark.parametrize(
    "override",
    [
        "model.layers=99999999999999999999999999999",
        "model.layers=10000000000",
        "train.optimizer=adamw(lr = 1e999)",
        "train.optimizer=adamw(lr = -1e-3)",
        "model.hidden=0",
        "model.layers=-4",
        "train.seed=123456789012345678901234567890",
        'model.arch="gpt"\nimport os',
        "train.steps=__import__('os')",
        "mesh.device=cpu;rm",
    ],
)
def test_hostile_values_are_rejected(override):
    kind, result = outcome(TINY, [override])
    assert kind == "rejected", f"{override!r} was accepted"
    assert all(e.code.startswith("PAR") for e in result)


def loaded():
    return load_text(TINY, "tiny.par", ONE_RANK)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: dataclasses.replace(s, model=dataclasses.replace(s.model, name="x; import os")),
        lambda s: dataclasses.replace(s, model=dataclasses.replace(s.model, name="def")),
        lambda s: dataclasses.replace(s, model=dataclasses.replace(s.model, layers="4; import os")),
        lambda s: dataclasses.replace(s, model=dataclasses.replace(s.model, dropout=float("nan"))),
        lambda s: dataclasses.replace(s, mesh=dataclasses.replace(s.mesh, device="cpu\nimport os")),
        lambda s: dataclasses.replace(
            s, train=dataclasses.replace(s.train, data=dataclasses.replace(s.train.data, path="a\nimport os"))
        ),
        lambda s: dataclasses.replace(
            s, train=dataclasses.replace(s.train, data=dataclasses.replace(s.train.data, dtype="uint16); import os; ("))
        ),
    ],
)
def test_specs_that_bypass_the_front_end_are_rejected(change):
    with pytest.raises(Diagnostics) as info:
        generate(change(loaded()))
    assert all(e.code.startswith("PAR08") for e in info.value.errors)


def test_bypassing_spec_with_hostile_path_is_inert():
    spec = loaded()
    hostile = "q'''\"\"\"; __import__('os').system('touch SENTINEL')"
    data = dataclasses.replace(spec.train.data, kind=type(spec.train.data.kind)("tokens"), path=hostile)
    files = generate(dataclasses.replace(spec, train=dataclasses.replace(spec.train, data=data)))
    assert_inert(train_py(files), must_contain=(hostile,))


@pytest.mark.parametrize("path", HOSTILE_PATHS[:3])
def test_running_a_hostile_build_has_no_side_effect(path, tmp_path):
    literal = path.replace('"', '\\"')
    kind, result = outcome(TINY, [*ONE_RANK, f'train.data=tokens("{literal}")'])
    if kind == "rejected":
        return
    out = tmp_path / "build"
    write(out, result)
    # No token file exists at the hostile path: the trainer must stop cleanly, and
    # the sentinel its text names must not appear anywhere.
    done = subprocess.run([sys.executable, str(out / "train.py"), "--steps", "1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "not found" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.rglob("SENTINEL*")) and not (Path.cwd() / "SENTINEL").exists()


def test_hostile_spec_file_name_cannot_break_out_of_comments(tmp_path):
    name = 'x\nimport os\nos.system("touch SENTINEL")\n"""\u2028$(touch SENTINEL).par'
    files = generate(load_text(TINY, name, ONE_RANK))
    assert_inert(train_py(files))
    for line in files["launch.sh"].decode().splitlines():
        assert "SENTINEL" not in line or line.startswith("#")
    done = subprocess.run(["bash", "-n"], input=files["launch.sh"].decode(), capture_output=True, text=True)
    assert done.returncode == 0
