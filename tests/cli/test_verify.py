"""``parc verify``: the shrink keeps every layout legal and buildable, the merge keeps hand
edits, and end to end a correct layout passes while a hand edit that breaks parity fails
naming the step (two short torchrun pairs: the only slow tests here)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from parc import dsl
from parc.codegen.build import build_to, generate
from parc.codegen.cli import main
from parc.codegen.shrink import shrink
from parc.codegen.verify import Record, Verdict

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.par"))
TINY = ROOT / "examples" / "tiny.par"


def shrunk(path: Path, sets: list[str] = ()) -> tuple:
    spec = dsl.load(str(path), list(sets))
    found = shrink(spec, steps=3)
    layout = dsl.load(str(path), [*sets, *found.overrides])
    reference = dsl.load(str(path), [*sets, *found.overrides, *found.reference])
    return spec, found, layout, reference


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_shrinks_to_a_buildable_spec_of_the_same_layout(path):
    spec, found, layout, reference = shrunk(path)
    assert "train.py" in generate(reference)
    par = layout.parallel
    assert par.dp * par.cp * par.tp * par.pp == found.world == layout.mesh.devices_per_node
    assert layout.mesh.nodes == 1 and layout.mesh.device == "cpu"
    assert layout.train.precision.value == "fp32" and layout.train.data.kind.value == "synthetic"
    assert layout.model.hidden <= 128 and layout.model.seq_len <= 16 and layout.model.vocab <= 256
    if spec.layout_complete:  # the layout is the spec's own
        for key in ("dp", "cp", "tp", "pp", "sp", "zero", "schedule", "chunks", "recompute", "overlap"):
            assert getattr(par, key) == getattr(spec.parallel, key), key
        assert layout.model.arch == spec.model.arch
        assert (layout.model.heads // layout.model.kv_heads) == (spec.model.heads // spec.model.kv_heads)
    if found.world <= 64:
        assert "train.py" in generate(layout)
    else:  # the planner's layouts of 1024+ ranks: shrunk, legal, too many processes to run here
        assert all(change.before == "auto" for change in found.changes if change.key.startswith("parallel."))


def test_llama_7b_keeps_its_layout_and_gqa():
    _, found, layout, _ = shrunk(ROOT / "examples" / "llama-7b.par")
    m, par = layout.model, layout.parallel
    assert (par.dp, par.tp, par.pp, par.sp, par.zero, par.recompute.value) == (2, 4, 2, True, 1, "selective")
    assert (m.heads, m.kv_heads, m.hidden, m.layers) == (16, 4, 128, 4)
    grad_accum = layout.train.global_batch // (layout.train.micro_batch * par.dp)
    assert grad_accum >= par.pp
    assert "train.precision=fp32" in found.overrides and found.world == 16


def test_per_layer_lists_shrink_stage_by_stage_in_order():
    sets = ["parallel.dp=1", "parallel.pp=2", "model.layers=8",
            "parallel.recompute=[full, full, full, full, none, none, selective, selective]"]
    _, _, layout, reference = shrunk(TINY, sets)
    modes = [r.value for r in layout.parallel.recompute]
    assert modes == ["full", "full", "none", "selective"]  # stage 1: one run (2 blocks); stage 2: two runs
    assert reference.parallel.recompute.value == "none" and reference.model.layers == 4


def test_uneven_stages_stay_uneven():
    sets = ["parallel.dp=1", "parallel.pp=2", "model.layers=8", "parallel.stage_layers=[3, 5]"]
    _, _, layout, reference = shrunk(TINY, sets)
    assert layout.parallel.stage_layers == (2, 3) and layout.model.layers == 5
    assert reference.parallel.stage_layers == (5,)


def test_a_padded_vocab_stays_padded():
    _, _, layout, _ = shrunk(ROOT / "examples" / "gpt2-small.par")
    assert layout.model.vocab % layout.model.pad_vocab_to != 0
    assert layout.model.padded_vocab % layout.parallel.tp == 0


def fake_verdict(layout_losses):
    _, found, _, _ = shrunk(TINY)
    records = [Record(name="loss", step=i + 1, reference=5.0, layout=v) for i, v in enumerate(layout_losses)]
    return Verdict(layout="dp 2 × tp 2", world=4, shrink=found, reference_overrides=found.reference,
                   records=tuple(records), seconds=1.0)


def test_report_names_the_first_step_that_differs():
    from parc.codegen.cli.verify import report_text

    verdict = fake_verdict([5.0, 5.00001, 5.1])
    text = report_text(verdict, "tiny.par")
    assert not verdict.passed and verdict.first_failure.step == 3
    assert "FAIL: step 3: loss differs: layout 5.1, one rank 5.0 (relative difference 0.02 > 1e-05)" in text
    assert "model.hidden        128 → 16" in text
    assert math.isinf(Record(name="loss", step=1, reference=5.0, layout=None).difference)


def test_usage_and_spec_errors(tmp_path, capsys):
    assert main(["verify", str(tmp_path / "nothing.par")]) == 2
    bad = tmp_path / "bad.par"
    bad.write_text(TINY.read_text().replace("tp = 2", "tp = 3"))
    assert main(["verify", str(bad)]) == 1
    assert "bad.par:22:8: error[PAR0203]: tp = 3 does not divide" in capsys.readouterr().err
    assert main(["verify", str(tmp_path)]) == 1
    assert "is not a parc build" in capsys.readouterr().err


def test_an_edit_of_a_shrunk_constant_is_named(tmp_path, capsys):
    spec = tmp_path / "tiny.par"
    spec.write_text(TINY.read_text())
    folder = build_to(spec, tmp_path / "build")
    train = folder / "train.py"
    train.write_text(train.read_text().replace("HIDDEN = 128", "HIDDEN = 256"))
    junit = tmp_path / "verify.xml"
    assert main(["verify", str(folder), "--junit", str(junit)]) == 1
    err = capsys.readouterr().err
    suite = ET.parse(junit).getroot()
    assert suite.get("errors") == "1" and "touches lines the shrink must change" in suite.find("testcase/error").get("message")
    line = train.read_text().splitlines().index(next(l for l in train.read_text().splitlines() if l.startswith("HIDDEN")))
    assert f"train.py:{line + 1}: your edit there touches lines the shrink must change" in err
    assert "HIDDEN = 16" in err


REFERENCE_RUNS: dict = {}


@pytest.fixture
def shared_reference(monkeypatch):
    """The two end-to-end tests shrink to the same one-rank program: run it once."""
    import hashlib

    from parc.codegen import verify

    real = verify.run_trainer

    def run_trainer(folder, nproc, *, steps, timeout):
        if nproc != 1:
            return real(folder, nproc, steps=steps, timeout=timeout)
        key = (hashlib.sha256((folder / "train.py").read_bytes()).hexdigest(), steps)
        if key not in REFERENCE_RUNS:
            REFERENCE_RUNS[key] = real(folder, nproc, steps=steps, timeout=timeout)
        return REFERENCE_RUNS[key]

    monkeypatch.setattr(verify, "run_trainer", run_trainer)


def test_a_correct_layout_passes(tmp_path, capsys, shared_reference):
    junit = tmp_path / "verify.xml"
    status = main(["verify", str(TINY), "--set", "parallel.dp=1", "--set", "mesh.devices_per_node=2",
                   "--steps", "2", "--junit", str(junit)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "layout: tp 2 (2 ranks, CPU gloo)" in out and "PASS: tp 2 trains like one rank" in out
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "3" and suite.get("failures") == "0"
    assert [case.get("name") for case in suite.iter("testcase")] == ["step 1 loss", "step 1 grad_norm", "step 2 loss"]


def test_a_build_edited_to_break_parity_fails_naming_the_step(tmp_path, capsys, shared_reference):
    spec = tmp_path / "tiny.par"
    spec.write_text(TINY.read_text())
    folder = build_to(spec, tmp_path / "build", ["parallel.dp=1", "mesh.devices_per_node=2"])
    train = folder / "train.py"
    text = train.read_text()
    forward = "loss = loss_fn(net(inputs, targets), net) / GRAD_ACCUM"
    assert forward in text
    # tp rank 0's loss scaled from step 2: the loss it logs and its gradient shards are wrong
    indent = text[: text.index(forward)].rsplit("\n", 1)[1]
    edited = text.replace(forward, forward + f'\n{indent}if step >= 2 and grid.index("tp") == 0:\n'
                          f"{indent}    loss = loss * 1.5")
    train.write_text(edited)
    junit = tmp_path / "verify.xml"
    status = main(["verify", str(folder), "--set", "parallel.dp=1", "--set", "mesh.devices_per_node=2",
                   "--steps", "2", "--junit", str(junit)])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "hand-edited files, kept: train.py" in out
    assert "FAIL: step 2: loss differs" in out
    assert train.read_text() == edited  # the user's folder is never written
    failed = [c.get("name") for c in ET.parse(junit).getroot().iter("testcase") if c.find("failure") is not None]
    assert failed[0] == "step 2 loss"


def test_a_folder_is_checked_against_its_spec(tmp_path, capsys):
    spec = tmp_path / "tiny.par"
    spec.write_text(TINY.read_text())
    folder = build_to(spec, tmp_path / "build")
    assert main(["verify", str(folder), "--set", "train.seed=7"]) == 1
    assert f"{folder} was not built from {spec} with these --set values" in capsys.readouterr().err
    moved = tmp_path / "elsewhere" / "build"
    moved.parent.mkdir()
    folder.rename(moved)
    assert main(["verify", str(moved)]) == 1
    assert "was built from tiny.par, found neither next to it nor in the cwd" in capsys.readouterr().err


def test_smallest_takes_the_first_candidate_the_rules_accept():
    from parc.runtime.layout import constraints

    values = {"hidden": 64, "heads": 8, "tp": 4, "ffn": 256, "vocab": 256, "pad_vocab_to": 128}
    assert constraints.smallest(values, ({"heads": h} for h in range(1, 9))) == {"heads": 4}
    assert constraints.smallest(values, ({"heads": h} for h in (1, 2, 3))) is None


def test_a_failing_rank_shows_its_own_exception(tmp_path, capsys, shared_reference):
    """Issue 31: torchrun's per-rank summary is not the error; the rank's own exception is."""
    spec = tmp_path / "tiny.par"
    spec.write_text(TINY.read_text())
    folder = build_to(spec, tmp_path / "build", ["parallel.dp=1", "mesh.devices_per_node=2"])
    train = folder / "train.py"
    text = train.read_text()
    forward = "loss = loss_fn(net(inputs, targets), net) / GRAD_ACCUM"
    indent = text[: text.index(forward)].rsplit("\n", 1)[1]
    train.write_text(text.replace(forward, forward + f'\n{indent}if grid.index("tp") == 1:\n'
                                  f'{indent}    raise RuntimeError("hand edit broke rank one")'))
    # no --set: the folder's manifest records the ones it was built with
    assert main(["verify", str(folder), "--steps", "2"]) == 1
    err = capsys.readouterr().err
    assert "train.py on rank 1 of 2 failed" in err
    assert "RuntimeError: hand edit broke rank one" in err


def test_rank_error_prefers_the_root_cause_rank(tmp_path):
    from parc.codegen.verify import rank_error

    for rank, text in ((0, "RuntimeError: Connection closed by peer\n"), (1, "Traceback ...\nValueError: mine\n")):
        log = tmp_path / "run_x" / "attempt_0" / str(rank) / "stderr.log"
        log.parent.mkdir(parents=True)
        log.write_text(text)
    summary = "Failures:\n  <NO_OTHER_FAILURES>\nRoot Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n"
    assert rank_error(tmp_path, summary) == (1, "Traceback ...\nValueError: mine\n")
    assert rank_error(tmp_path, "")[0] == 0  # no summary: the first rank whose log holds an error
    assert rank_error(tmp_path / "none", summary) == (None, "")


@pytest.mark.parametrize("sets", [
    ["model.experts=4", "parallel.ep=2"],
    ["model.experts=4", "parallel.etp=2"],
    ["mesh.devices_per_node=4", "parallel.dp=1", "parallel.tp=4", "parallel.tp_shape=(2, 2)"],
    ["parallel.cp=2", "parallel.dp=1", "parallel.cp_kind=ulysses"],
    ["parallel.pp=2", "parallel.dp=1", "parallel.compress_pp=lowrank(rank = 2)", "parallel.compress_stages=[1]"],
], ids=["ep", "etp", "tp_shape-2d", "cp-ulysses", "compress-stages"])
def test_the_reference_resets_every_parallel_key(sets):
    """Issue 31: ep, etp or a 2D tp_shape reached the one-rank reference and made it illegal."""
    from parc.dsl.keys import PARALLEL

    _, found, _, reference = shrunk(TINY, sets)
    par = reference.parallel
    assert (par.dp, par.tp, par.pp, par.cp, par.ep, par.etp, par.tp_shape, par.zero) == (1, 1, 1, 1, 1, 1, None, 0) or \
        (par.dp, par.tp, par.pp, par.cp, par.ep, par.etp, par.tp_shape, par.zero) == (1, 1, 1, 1, 1, 1, (1, 1), 0)
    written = {item.split("=")[0] for item in found.reference}
    left = {f"parallel.{p.name}" for p in PARALLEL.keys} - written
    assert left <= {"parallel.stage_layers", "parallel.compress_stages"}, left
    assert "train.py" in generate(reference)
    assert par.compress_stages is None  # a compress_pp spec's stage list is taken back out (--set ...=default)


def test_lossy_choices_are_shrunk_with_their_reason():
    """Compression and bf16 sums are lossy by design: verify compares the layout without them
    (saying so), since no layout of them equals one rank at 1e-5 (tests/parity/test_compress.py
    holds their convergence)."""
    sets = ["parallel.pp=2", "parallel.dp=1", "parallel.compress_pp=lowrank(rank = 2)",
            "parallel.compress_stages=[1]"]
    _, found, _, _ = shrunk(TINY, sets)
    changed = {c.key: (c.after, c.why) for c in found.changes}
    assert changed["parallel.compress_pp"][0] == "none" and "by design" in changed["parallel.compress_pp"][1]
    assert changed["parallel.compress_stages"][0] == "default"
    _, found, _, _ = shrunk(TINY, ["parallel.compress=powersgd(rank = 2)",
                                   "train.grad_reduce=bf16"])
    changed = {c.key: c.after for c in found.changes}
    assert changed["parallel.compress"] == "none" and changed["train.grad_reduce"] == "fp32"
