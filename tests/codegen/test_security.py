"""The spec can never inject code (DESIGN §8).

A corpus of hostile specs — quotes, newlines, escapes, ``__import__('os')``, Python
keywords, look-alike Unicode, huge numbers, hostile ``--set`` values and file names,
and ``Spec`` objects built by hand to bypass the front end — must each either be
rejected with ``Diagnostics`` (and no other exception), or compile to inert code:

* ``train.py`` parses with ``ast`` and has exactly the shape of the plain tiny build
  (same statements, calls and names; only literal values may differ);
* every identifier in it is on the allow-list taken from the plain builds, and no
  call reaches ``eval``/``exec``/``__import__``/``compile``/``open``/``system``/...;
* a hostile string shows up only as a string constant holding exactly the value the
  spec gave (``DATA_PATH``), or inside the docstring/description text;
* ``launch.sh`` runs the same commands as the plain build (hostile text only in
  comments, on one line).

A few accepted cases are run (``python train.py --steps 1``, one rank) and must not
create the sentinel file the payload would ``touch``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from parc.codegen.build import build_to, generate, seen_from
from parc.dsl import load_text
from parc.dsl.diagnostics import Diagnostics, Span
from parc.dsl.spec import DataKind
from parc.runtime.layout.model_record import unchecked_config

ROOT = Path(__file__).resolve().parents[2]
TINY_PATH = ROOT / "examples" / "tiny.par"
TINY = TINY_PATH.read_text()
ONE_RANK = ("parallel.dp=1", "parallel.tp=1", "mesh.devices_per_node=1")
SENTINEL = "SENTINEL"
TOUCH = f"__import__('os').system('touch {SENTINEL}')"

BANNED_CALLS = {
    "eval", "exec", "__import__", "compile", "open", "system", "popen", "spawn",
    "getattr", "setattr", "delattr", "globals", "locals", "vars", "breakpoint", "input",
    "import_module", "run", "Popen", "call", "check_output", "loads",
}
"""Names no call in a generated train.py may reach (``run`` etc. cover subprocess)."""


# ---- helpers --------------------------------------------------------------------


def load(text: str = TINY, file: str = "tiny.par", overrides=()):
    return load_text(text, file, [*ONE_RANK, *overrides])


def with_name(name: str) -> str:
    assert "model gpt_tiny {" in TINY
    return TINY.replace("model gpt_tiny {", f"model {name} {{")


def with_data(par_value: str) -> str:
    """tiny.par with ``data = <par_value>`` (written as .par source text)."""
    assert "data = synthetic" in TINY
    return TINY.replace("data = synthetic", f"data = {par_value}")


def tokens_spec(base, path, **more):
    data = replace(base.train.data, kind=DataKind.TOKENS, path=path, **more)
    return replace(base, train=replace(base.train, data=data))


class EvilStr(str):
    """Equal to a safe value, but ``repr`` (what the renderer emits) is code."""

    def __repr__(self):
        return TOUCH

    __str__ = __repr__


def identifiers(tree: ast.AST) -> set[str]:
    """Every name the code mentions outside string literals."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.name)
            if node.asname:
                out.add(node.asname)
        elif isinstance(node, ast.ImportFrom):
            out.add(node.module or "")
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
    return out


def shape(tree: ast.AST) -> str:
    """The AST with every literal value blanked: what the code *does*."""

    class Blank(ast.NodeTransformer):
        def visit_Constant(self, node):
            return ast.copy_location(ast.Constant(value=None), node)

        def visit_UnaryOp(self, node):  # -1.0 is a literal too
            if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
                return ast.copy_location(ast.Constant(value=None), node)
            return self.generic_visit(node)

    return ast.dump(Blank().visit(ast.parse(ast.unparse(tree))))  # on a copy: tree stays intact


def constants(tree: ast.Module) -> dict[str, object]:
    """Module-level ``NAME = literal`` assignments."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def command_lines(launch: str) -> list[str]:
    return [line for line in launch.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def baseline(data: str = "synthetic", overrides=ONE_RANK) -> dict[str, bytes]:
    text = TINY if data == "synthetic" else with_data('tokens("corpus.bin")')
    return generate(load_text(text, "tiny.par", list(overrides)))


BASELINES = {
    "synthetic": baseline("synthetic"),
    "tokens": baseline("tokens"),
}
ALLOWED = set()
for _files in (*BASELINES.values(), baseline("synthetic", ()), baseline("tokens", ())):
    ALLOWED |= identifiers(ast.parse(_files["train.py"]))
ALLOWED -= BANNED_CALLS  # never allowed, even if a plain build someday used one
SHAPES = {kind: shape(ast.parse(files["train.py"])) for kind, files in BASELINES.items()}
LAUNCH = {kind: command_lines(files["launch.sh"].decode()) for kind, files in BASELINES.items()}


def outcome(make):
    """``make()`` → Spec → files; ``Diagnostics`` is the only acceptable failure."""
    try:
        spec = make()
        return spec, generate(spec)
    except Diagnostics as exc:
        assert exc.errors, "Diagnostics raised with no errors"
        for error in exc.errors:
            assert error.code.startswith("PAR") and error.code[3:].isdigit(), error.code
            assert error.message
        return None, exc


def assert_inert(spec, files: dict[str, bytes]) -> ast.Module:
    text = files["train.py"].decode()
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:  # pragma: no cover - the failure is the finding
        pytest.fail(f"generated train.py does not parse: {exc}")
    # Names: only those of the plain builds.
    extra = identifiers(tree) - ALLOWED
    assert not extra, f"names outside the allow-list: {sorted(extra)}"
    # Calls: none to anything that runs or loads code.
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            assert called not in BANNED_CALLS, f"call to {called} at line {node.lineno}"
    # Shape: exactly the plain build's statements; only literal values differ.
    kind = spec.train.data.kind.value
    assert shape(tree) == SHAPES[kind], "train.py has code the plain build does not"
    # Literals: hostile strings appear only as the intended constants.
    path = spec.train.data.path if kind == "tokens" else None
    consts = constants(tree)
    if path is not None:
        assert consts["DATA_PATH"] == path and type(consts["DATA_PATH"]) is str
        assert consts["DATA_DTYPE"] == spec.train.data.dtype
    else:
        assert "DATA_PATH" not in consts
    docstring = ast.get_docstring(tree, clean=False)
    allowed_text = {docstring, f"Train {spec.model.name} (one rank).", path}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            hostile = any(mark in node.value for mark in (SENTINEL, "__import__", "system", "import os"))
            if hostile:
                assert node.value in allowed_text, f"hostile text in an unexpected literal: {node.value!r}"
    if path is not None:
        # The path is in DATA_PATH alone (checked above); the docstring names the constant.
        assert "(default DATA_PATH, from this file's folder)" in docstring and path not in docstring
    # launch.sh runs exactly the plain build's commands.
    assert command_lines(files["launch.sh"].decode()) == LAUNCH[kind]
    return tree


def check(make):
    spec, result = outcome(make)
    if spec is not None:
        assert_inert(spec, result)
    return spec, result


# ---- the corpus: text through the front end ---------------------------------------

NAMES = [
    "os.system", "__import__", "eval", "print", "exec", "class", "lambda", "match", "case",
    "_", "type", "True", "None", "__builtins__",
    "gрt",        # Cyrillic р (U+0440)
    "ѕуѕ",        # all-Cyrillic look-alike of sys
    "ｇpt",       # fullwidth g: NFKC-folds to gpt in Python
    "gpt\u200b",  # zero-width space
    "x" * 5000,
    "1abc", "a-b", "a;b", "`x`",
]

PAR_PATHS = [  # each is the inside of tokens("...") as written in .par text
    r"x\"); import os; os.system('touch SENTINEL') #.bin",
    "''' + __import__('os').system('touch SENTINEL') + '''.bin",
    r"\"\"\" + __import__('os').system('touch SENTINEL') + \"\"\"",
    r"a\\",
    r"\\\"\"\"\\",
    r"a\nimport os\nos.system('touch SENTINEL')",
    r"a\rimport os",
    r"a\tb.bin",
    r"a\u0000b",
    r"a\u2028import os\u0085b",
    r"a\x85b",
    "{{ 7 * 7 }}{% raw %}.bin",
    "$(touch SENTINEL)`touch SENTINEL`.bin",
    "dаta.bin",  # Cyrillic а
    "",
    "x" * 5000,
    r"C:\\evil\\",
    "%s%r%(x)s{0}{x!r}.bin",
    "café/дата/SENTINEL.bin",
]

OVERRIDES = [
    f"train.data=tokens(\"''' + {TOUCH} + '''\")",
    "train.data=tokens(\"\\\"\\\"\\\"; import os; os.system('touch SENTINEL'); \\\"\\\"\\\"\")",
    "train.data=tokens(\"a\\nimport os\")",
    f"train.data={TOUCH}",
    "model.layers=__import__(\"os\")",
    "model.layers=10**9999",
    "model.layers=" + "9" * 5000,
    "model.layers=1e999",
    "model.layers=0",
    "model.layers=-4",
    "model.hidden=99999999999999999999999",
    "model.dropout=-1",
    "model.dropout=1e-320",
    "model.norm_eps=0",
    "train.seed=99999999999999999999999",
    "train.seed=0",
    "train.steps=0",
    "train.grad_clip=1e308",
    "train.optimizer=adamw(lr = 1e999)",
    "train.optimizer=adamw(lr = -1)",
    "train.optimizer=__import__(lr = 1)",
    'mesh.device="cpu\\"; import os"',
    "mesh.device=cpu; import os",
    "model.name=os",
    "model.__class__=1",
    f"__import__('os').system('touch {SENTINEL}')=1",
    "train.precision=bf16; import os",
    "model.layers=10000000000",
    "model.hidden=0",
    'model.arch="gpt"\nimport os',
    "train.steps=__import__('os')",
    "mesh.device=cpu;rm",
]

MUST_REJECT = [  # not a value of the key at all: accepting one would be a front-end bug
    f"train.data={TOUCH}",
    "model.layers=__import__(\"os\")",
    "model.layers=10**9999",
    "model.layers=" + "9" * 5000,
    "model.layers=1e999",
    "model.layers=0",
    "model.layers=-4",
    "model.layers=10000000000",
    "model.hidden=0",
    "model.hidden=99999999999999999999999",
    "train.seed=99999999999999999999999",
    "train.optimizer=adamw(lr = 1e999)",
    "train.optimizer=__import__(lr = 1)",
    'mesh.device="cpu\\"; import os"',
    "mesh.device=cpu; import os",
    "mesh.device=cpu;rm",
    'model.arch="gpt"\nimport os',
    "train.steps=__import__('os')",
    "model.__class__=1",
    f"__import__('os').system('touch {SENTINEL}')=1",
]

FILES = [
    "evil\nimport os\nos.system('touch SENTINEL')\n#.par",
    'a""" + __import__("os").system("touch SENTINEL") + """.par',
    "a''' + __import__('os').system('touch SENTINEL') + '''.par",
    "$(touch SENTINEL)`touch SENTINEL`.par",
    "dir\\with\\back\\slash\\.par",
    "x\u2028import os\r\n#.par",
    # plan_text.cite() returns a span's file verbatim when it starts with "--set" (meant
    # for override spans): a spec *file* so named puts its newline into every "# ..." comment.
    "--set 1\nimport os\nos.system('touch SENTINEL')\n#.par",
    "--set\rimport os\r#.par",
]


@pytest.mark.parametrize("name", NAMES, ids=ascii)
def test_model_name(name):
    spec, result = check(lambda: load(with_name(name)))
    if spec is not None:
        assert name.isascii() and name.isidentifier(), f"non-identifier model name {name!r} accepted"


@pytest.mark.parametrize("par_path", PAR_PATHS, ids=ascii)
def test_data_path_text(par_path):
    check(lambda: load(with_data(f'tokens("{par_path}")')))


@pytest.mark.parametrize("override", OVERRIDES, ids=ascii)
def test_override(override):
    check(lambda: load(overrides=[override]))


@pytest.mark.parametrize("override", MUST_REJECT, ids=ascii)
def test_invalid_override_is_rejected(override):
    spec, result = outcome(lambda: load(overrides=[override]))
    assert spec is None, f"{override!r} was accepted"


@pytest.mark.parametrize("file", FILES, ids=ascii)
def test_spec_file_name(file):
    spec, result = check(lambda: load(file=file))
    if spec is not None:  # launch.sh is still valid bash, the name only in comments
        launch = result["launch.sh"].decode()
        done = subprocess.run(["bash", "-n"], input=launch, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        for line in launch.splitlines():
            assert SENTINEL not in line or line.startswith("#"), line


def test_accepted_cases_are_accepted():
    """The corpus really reaches codegen (the inert branch is not vacuous)."""
    assert outcome(lambda: load(with_name("__import__")))[0] is not None
    assert outcome(lambda: load(with_data(f'tokens("{PAR_PATHS[0]}")')))[0] is not None
    assert outcome(lambda: load(overrides=[OVERRIDES[0]]))[0] is not None


# ---- the corpus: Spec objects built by hand (bypassing the front end) ----------------

BASE = load()
BASE_TOKENS = load(with_data('tokens("corpus.bin")'))


def _model(**kw):
    """BASE with model keys replaced; a shape key goes into the runtime's record
    (Note [one model record]) as a hand-built one would, skipping its own checks."""
    config = dict(_fields(BASE.model.config))
    shape = {key: value for key, value in kw.items() if key in config}
    config.update(shape)
    unchecked = unchecked_config(**config)
    rest = {key: value for key, value in kw.items() if key not in shape}
    return replace(BASE, model=replace(BASE.model, config=unchecked, **rest))


def _fields(record) -> dict:
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _mesh(**kw):
    return replace(BASE, mesh=replace(BASE.mesh, **kw))


def _train(**kw):
    return replace(BASE, train=replace(BASE.train, **kw))


def _optimizer(**kw):
    return _train(optimizer=replace(BASE.train.optimizer, **kw))


def _spans(key, span):
    return replace(BASE, spans=tuple((k, span if k == key else s) for k, s in BASE.spans))


def _span(**kw):
    fields = dict(file="tiny.par", line=6, column=1, end_line=6, end_column=2)
    fields.update(kw)
    return Span(**fields)


DIRECT = {
    "name-statement": lambda: _model(name="x; import os"),
    "name-call": lambda: _model(name=f"x = {TOUCH}"),
    "name-newline": lambda: _model(name="x\nimport os"),
    "name-cyrillic": lambda: _model(name="gрt"),
    "name-fullwidth": lambda: _model(name="ｇpt"),
    "name-keyword": lambda: _model(name="lambda"),
    "name-soft-keyword": lambda: _model(name="match"),
    "name-empty": lambda: _model(name=""),
    "name-bytes": lambda: _model(name=b"gpt"),
    "name-evil-str": lambda: _model(name=EvilStr("gpt")),
    "arch-str": lambda: _model(arch="gpt"),
    "arch-evil-str": lambda: _model(arch=EvilStr("gpt")),
    "layers-float": lambda: _model(layers=4.0),
    "layers-bool": lambda: _model(layers=True),
    "layers-huge": lambda: _model(layers=10**100),
    "layers-str": lambda: _model(layers=f"4 + {TOUCH}"),
    "layers-negative": lambda: _model(layers=-4),
    "dropout-nan": lambda: _model(dropout=float("nan")),
    "dropout-inf": lambda: _model(dropout=float("-inf")),
    "dropout-negative": lambda: _model(dropout=-1.0),
    "dropout-str": lambda: _model(dropout=TOUCH),
    "tie-str": lambda: _model(tie_embeddings="True"),
    "device-statement": lambda: _mesh(device="cpu; import os"),
    "device-quote": lambda: _mesh(device='cpu"\nimport os'),
    "device-newline": lambda: _mesh(device="cpu\nimport os"),
    "device-evil-str": lambda: _mesh(device=EvilStr("cpu")),
    "device-cyrillic": lambda: _mesh(device="сpu"),
    "flops-str": lambda: _mesh(device_flops="1e12"),
    "flops-inf": lambda: _mesh(device_flops=float("inf")),
    "lr-nan": lambda: _optimizer(lr=float("nan")),
    "lr-evil-float": lambda: _optimizer(lr=type("F", (float,), {"__repr__": lambda s: TOUCH})(0.1)),
    "betas-list": lambda: _optimizer(betas=[0.9, 0.95]),
    "betas-str": lambda: _optimizer(betas=("0.9", "0.95")),
    "optimizer-name": lambda: _optimizer(name=f"x'); {TOUCH} #"),
    "precision-str": lambda: _train(precision="fp32"),
    "seed-negative": lambda: _train(seed=-1),
    "seed-huge": lambda: _train(seed=10**40),
    "steps-evil-int": lambda: _train(steps=type("I", (int,), {"__repr__": lambda s: TOUCH})(20)),
    "path-statement": lambda: tokens_spec(BASE, "x\"); import os; os.system('touch SENTINEL') #.bin"),
    "path-triple-double": lambda: tokens_spec(BASE, f'x""" + {TOUCH} + """\\'),
    "path-triple-single": lambda: tokens_spec(BASE, f"x''' + {TOUCH} + '''\\"),
    "path-newline": lambda: tokens_spec(BASE, '"""\nimport os\n"""'),
    "path-cr": lambda: tokens_spec(BASE, "a\rimport os"),
    "path-nul": lambda: tokens_spec(BASE, "a\x00b"),
    "path-unicode-breaks": lambda: tokens_spec(BASE, "a\u2028import os\u0085b\u2029"),
    "path-surrogate": lambda: tokens_spec(BASE, "a\udc80b"),
    "path-all-quotes": lambda: tokens_spec(BASE, f"q'''\"\"\"; {TOUCH}"),
    "path-backslashes": lambda: tokens_spec(BASE, "\\\\\\N{BULLET}\\x41\\"),
    "path-empty": lambda: tokens_spec(BASE, ""),
    "path-bytes": lambda: tokens_spec(BASE, b"a.bin"),
    "path-evil-str": lambda: tokens_spec(BASE, EvilStr("a.bin")),
    "path-on-synthetic": lambda: replace(
        BASE, train=replace(BASE.train, data=replace(BASE.train.data, path=f"x''' + {TOUCH} + '''"))
    ),
    "dtype-code": lambda: tokens_spec(BASE, "a.bin", dtype=TOUCH),
    "dtype-statement": lambda: tokens_spec(BASE, "a.bin", dtype="uint16); import os; ("),
    "dtype-evil-str": lambda: tokens_spec(BASE, "a.bin", dtype=EvilStr("uint16")),
    "kind-str": lambda: replace(
        BASE_TOKENS, train=replace(BASE_TOKENS.train, data=replace(BASE_TOKENS.train.data, kind="tokens"))
    ),
    "source-newline": lambda: replace(BASE, source="x\nimport os\nos.system('touch SENTINEL')\n#.par"),
    "source-quotes": lambda: replace(BASE, source=f'a""" + {TOUCH} + """.par'),
    "source-set-newline": lambda: replace(BASE, source="--set 1\nimport os\n#.par"),
    "span-file-newline": lambda: _spans("model.layers", _span(file="x\nimport os\n#")),
    # cite() prints span.file (``--set`` branch) and span.line without checking them.
    "span-set-file-newline": lambda: _spans(
        "model.layers", _span(file=f"--set 1\nimport os; os.system('touch {SENTINEL}')\n#")
    ),
    "span-line-str": lambda: _spans("model.layers", _span(line=f"6\n{TOUCH}\n#")),
}


@pytest.mark.parametrize("case", DIRECT)
def test_direct_spec(case):
    check(DIRECT[case])


def test_direct_spec_suspects_are_rejected():
    """Values that are not what a Spec field holds must be diagnosed, not rendered."""
    for case in ("name-statement", "name-cyrillic", "name-keyword", "name-evil-str", "arch-evil-str",
                 "layers-str", "device-newline", "device-evil-str", "lr-evil-float", "steps-evil-int", "path-newline",
                 "path-evil-str", "dtype-code", "dtype-statement", "dtype-evil-str", "kind-str"):
        spec, result = outcome(DIRECT[case])
        assert spec is None, f"{case}: accepted"


# ---- run the accepted ones: no sentinel side effect ------------------------------------

RUNS = {
    "quote-statement": (with_data(f'tokens("{PAR_PATHS[0]}")'), "tiny.par", ()),
    "triple-double-backslash": (
        with_name("__import__"),
        'a""" + __import__("os").system("touch SENTINEL") + """.par',
        ('train.data=tokens("\\"\\"\\" + __import__(\'os\').system(\'touch SENTINEL\') + \\"\\"\\"\\\\")',),
    ),
}


def _run(tmp_path, text, file, overrides, *, make_tokens=True):
    spec_file = tmp_path / "spec.par"
    spec_file.write_text(text)
    spec = load(text, file, overrides)  # the file name as the user wrote it
    files = generate(spec)
    assert_inert(spec, files)
    out = tmp_path / "build"
    out.mkdir()
    for rel, data in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    path = spec.train.data.path
    if path is not None and make_tokens:
        target = out / path  # DATA_PATH is from train.py's folder (the cwd does not matter)
        target.parent.mkdir(parents=True, exist_ok=True)
        (np.arange(4096) % spec.model.vocab).astype(np.uint16).tofile(target)
    done = subprocess.run(
        [sys.executable, str(out / "train.py"), "--steps", "1"],
        cwd=cwd, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    for folder in (cwd, out, tmp_path):
        assert not (folder / SENTINEL).exists(), "the injected command ran"
    assert not list(tmp_path.rglob(SENTINEL)), "the injected command ran"
    return done


@pytest.mark.parametrize("case", RUNS)
def test_hostile_build_runs_inert(tmp_path, case):
    text, file, overrides = RUNS[case]
    done = _run(tmp_path, text, file, overrides)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_hostile_path_that_cannot_exist_fails_cleanly(tmp_path):
    name = "x" * 300 + f"''' + {TOUCH} + '''.bin"  # longer than any file name may be
    text = with_data('tokens("' + name.replace("\\", "\\\\").replace('"', '\\"') + '")')
    done = _run(tmp_path, text, "tiny.par", (), make_tokens=False)
    assert done.returncode != 0
    assert "train.py: --data " in done.stderr and "Traceback" not in done.stderr  # "File name too long"


def test_build_to_writes_a_hostile_folder_inert(tmp_path):
    """The CLI path (``build_to``) renders the same bytes as ``generate``."""
    spec_file = tmp_path / "spec.par"
    spec_file.write_text(with_data(f'tokens("{PAR_PATHS[1]}")'))
    out = build_to(spec_file, tmp_path / "build", ONE_RANK)
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    spec = seen_from(load(spec_file.read_text(), str(spec_file)), out)  # the path from the build folder
    assert_inert(spec, files)
    assert files["train.py"] == generate(spec)["train.py"]
