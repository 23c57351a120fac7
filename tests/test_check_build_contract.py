"""The contract: ``parc check`` accepts a spec exactly when ``parc build`` can build it.

Over a grid of spec variants (every example in ``examples/`` × ``--set`` sweeps of
every value the docs list for each enumerated key, and degrees, batches and sizes
that do and do not divide), in process and without writing files:

- *check*: ``parc.dsl.load`` (what ``parc check`` runs);
- *build*: the build's own guards on a ``Spec`` that bypassed the front end's rules
  (parsed, normalized, schema-checked, then assembled without ``dsl/checks.py``),
  lowered and rendered — so a rule only the front end knows, or only the build
  knows, is a disagreement.

They must agree on every variant, and where both refuse, the build's errors are
among the check's (same code, same message). ``auto`` specs run the planner, which is
slow on the big examples: those get a few variants. Rendering swaps black for a
``compile`` of the unformatted text (black costs ~0.15 s a file; a render that black
would refuse does not compile either); ``test_some_variants_render_with_black``
keeps black honest on a sample.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import black
import pytest

from parc.codegen.lower import lower
from parc.codegen.render import render
from parc.dsl import Diagnostics, load, read_text
from parc.dsl.build_spec import build_spec
from parc.dsl.normalize import normalize_document
from parc.dsl.overrides import apply_overrides
from parc.dsl.parse import parse
from parc.dsl.validate import schema_errors

EXAMPLES = sorted(str(p) for p in Path("examples").glob("*.par"))
AUTO = {"examples/gpt3-175b.par", "examples/gpt-1t.par", "examples/llama3-8b-32k.par", "examples/mixtral-8x7b.par",
        "examples/deepseek-moe.par"}

SWEEP = {
    "parallel.zero": ["0", "1", "2", "3"],
    "train.precision": ["fp32", "bf16", "fp16"],
    "train.master_weights": ["fp32"],
    "train.grad_reduce": ["fp32", "bf16"],
    "parallel.schedule": ["gpipe", "1f1b", "interleaved(chunks = 2)", "interleaved(chunks = 3)", "zero_bubble",
                          "chimera", "zero_bubble_v", "terapipe(slices = 2)",
                          "terapipe(slices = [32, 16, 16])"],
    "parallel.recompute": ["none", "selective", "full"],
    "parallel.overlap": ["none", "sub_batch(2)", "sub_batch(3)", "sub_batch(4)"],
    "parallel.sp": ["true", "false"],
    "parallel.dp": ["1", "2", "3", "4"],
    "parallel.tp": ["1", "2", "3", "4", "8"],
    "parallel.pp": ["1", "2", "3", "4"],
    "parallel.cp": ["1", "2", "3", "4"],
    "parallel.cp_kind": ["ring", "ulysses", "allgather"],
    "parallel.stage_layers": ["[1, 3]", "[2, 2]", "[4]"],
    "train.global_batch": ["8", "12", "16", "17", "32"],
    "train.micro_batch": ["1", "2", "3", "4", "8"],
    "train.kernels": ["compiled", "eager"],
    "train.data": ["synthetic", 'tokens("x.bin")', 'tokens("x.bin", dtype = uint32)'],
    "train.schedule": ["constant", "cosine(warmup = 5)", "linear(warmup = 500)"],
    "train.on_nonfinite": ["skip", "stop"],
    "train.checkpoint": ["none", "every(5)"],
    "mesh.nodes": ["1", "2"],
    "mesh.devices_per_node": ["1", "2", "4", "8"],
    "model.kv_heads": ["1", "2", "3"],
    "model.vocab": ["500", "70000"],
    "model.pad_vocab_to": ["1", "128"],
    "model.seq_len": ["63", "64"],
    "model.layers": ["3", "4", "6"],
    "model.heads": ["3", "4", "8"],
    "model.name": ["ok_name", "match", "type"],
}
AUTO_SWEEP = [[], ["parallel.zero=3"], ["train.precision=fp16"], ["parallel.tp=3"], ["parallel.pp=7"]]

def variants() -> list[tuple[str, tuple[str, ...]]]:
    out = []
    for example in EXAMPLES:
        if example in AUTO:
            out += [(example, tuple(sets)) for sets in AUTO_SWEEP]
            continue
        out.append((example, ()))
        out += [(example, (f"{key}={value}",)) for key, values in SWEEP.items() for value in values]
    # Layouts of the tiny GPT: degrees that do and do not fill the 4 ranks, with each
    # schedule and sp; then overlap against micro_batch and tp.
    for dp, tp, pp, schedule, sp in itertools.product(
        (1, 2, 4), (1, 2, 4), (1, 2, 4), ("1f1b", "gpipe", "interleaved(chunks = 2)", "zero_bubble"), ("false", "true")
    ):
        out.append(("examples/tiny.par", (f"parallel.dp={dp}", f"parallel.tp={tp}", f"parallel.pp={pp}",
                                          f"parallel.schedule={schedule}", f"parallel.sp={sp}")))
    for overlap, micro_batch, tp in itertools.product(("sub_batch(2)", "sub_batch(4)"), (1, 2, 4), (1, 2, 4)):
        out.append(("examples/tiny.par", (f"parallel.overlap={overlap}", f"train.micro_batch={micro_batch}",
                                          f"parallel.tp={tp}", f"parallel.dp={4 // tp}")))
    # context parallel on the tiny GPT's 4 ranks (heads = 4, seq_len = 64): each kind,
    # degrees that do and do not fill the mesh or split the heads, with sp, pp, a
    # planner-chosen dp, and cp itself left to the planner
    for cp, tp, kind, sp, pp in itertools.product(
        (1, 2, 4), (1, 2), ("ring", "ulysses", "allgather"), ("false", "true"), (1, 2)
    ):
        dp = max(1, 4 // (cp * tp * pp))
        out.append(("examples/tiny.par", (f"parallel.cp={cp}", f"parallel.tp={tp}", f"parallel.pp={pp}",
                                          f"parallel.dp={dp}", f"parallel.cp_kind={kind}", f"parallel.sp={sp}")))
    out += [("examples/tiny.par", ("parallel.cp=auto", "parallel.dp=auto", "parallel.tp=auto")),
            ("examples/tiny.par", ("parallel.cp=auto", "parallel.cp_kind=ulysses", "parallel.dp=auto")),
            ("examples/tiny.par", ("parallel.cp=2", "parallel.cp_kind=ulysses", "parallel.dp=auto")),
            ("examples/tiny.par", ("parallel.cp=3", "parallel.cp_kind=allgather", "model.seq_len=63"))]
    # heterogeneous layouts (runtime/parallel/data/hetero.py) on the tiny GPT's 4 ranks: lists that do and do
    # not fit, with each feature they are not built with yet, and a dp list alone
    for tps, sp, extra in itertools.product(
        ("[4, 4, 2, 1]", "[2, 2, 1, 1]", "[1, 2, 4, 2]", "[2, 2, 2]"), ("false", "true"),
        ((), ("parallel.zero=1",), ("parallel.pp=2",), ("parallel.overlap=sub_batch(2)",), ("train.micro_batch=4",)),
    ):
        dps = "[" + ", ".join(str(4 // int(t)) for t in tps.strip("[]").split(", ")) + "]"
        out.append(("examples/tiny.par", (f"parallel.tp={tps}", f"parallel.dp={dps}", f"parallel.sp={sp}", *extra)))
    out += [("examples/tiny.par", ("parallel.dp=[2, 2, 4, 4]",)),
            ("examples/tiny.par", ("parallel.tp=[2, 2, 2, 2]", "parallel.dp=[2, 2, 2, 2]"))]
    # 2D tensor parallelism on the tiny GPT's 4 ranks: C splits the heads, R the hidden size
    # (PAR0203 on a grid), heads that tp does and does not divide
    for shape, heads, hidden in itertools.product(("(2, 2)", "(4, 1)", "(2, 1)", "(1, 4)"), (2, 3, 4), (90, 128)):
        rows, cols = (int(n) for n in shape.strip("()").split(", "))
        out.append(("examples/tiny.par", (f"parallel.tp={rows * cols}", f"parallel.dp={4 // (rows * cols)}",
                                          f"parallel.tp_shape={shape}", f"model.heads={heads}",
                                          f"model.hidden={hidden}")))
    return out


VARIANTS = variants()


def check(path: str, sets) -> list | None:
    """``parc check``: None when it accepts, else its (code, message) list."""
    try:
        load(path, list(sets))
    except Diagnostics as exc:
        return [(e.code, e.message) for e in exc.errors]
    return None


def unchecked_spec(path: str, sets):
    """The Spec the front end would build if ``dsl/checks.py`` did not exist (None: the
    text or the schema refuses it, which ``parc build`` shares with ``parc check``)."""
    norm = normalize_document(parse(read_text(path), path))
    apply_overrides(norm, list(sets))
    if norm.errors or schema_errors(norm):
        return None
    return build_spec(norm, path)


def _compile_only(text: str, mode=None) -> str:
    compile(text, "train.py", "exec")
    return text


def build(path: str, sets, monkeypatch) -> list | None:
    """The build's own verdict: None when it lowers and renders, else its (code, message) list."""
    spec = unchecked_spec(path, sets)
    if spec is None:
        return [("schema", "")]
    try:
        plan = lower(spec)
    except Diagnostics as exc:
        return [(e.code, e.message) for e in exc.errors]
    with monkeypatch.context() as patch:
        patch.setattr(black, "format_str", _compile_only)
        render(plan)
    return None


def test_the_grid_is_big_enough():
    assert len(VARIANTS) >= 400
    assert {path for path, _ in VARIANTS} == set(EXAMPLES)


def test_check_accepts_exactly_what_build_builds(monkeypatch):
    disagreements = []
    accepted = 0
    for path, sets in VARIANTS:
        checked, built = check(path, sets), build(path, sets, monkeypatch)
        accepted += checked is None
        if built == [("schema", "")]:
            assert checked is not None, (path, sets)
            continue
        if (checked is None) != (built is None):
            disagreements.append((path, sets, checked, built))
        elif checked is not None and not set(built) <= set(checked):
            disagreements.append((path, sets, checked, built))
    assert not disagreements, "\n".join(map(str, disagreements[:10]))
    assert 0.2 * len(VARIANTS) < accepted < 0.8 * len(VARIANTS)  # the grid has both sides


@pytest.mark.parametrize("sets", [(), ("parallel.dp=1", "parallel.pp=2", "parallel.schedule=gpipe"),
                                  ("parallel.overlap=sub_batch(2)", "parallel.sp=true")])
def test_some_variants_render_with_black(sets):
    assert check("examples/tiny.par", sets) is None
    render(lower(load("examples/tiny.par", list(sets))))
