"""`parc explain`: the printed schedule, schedule.svg, determinism and diagnostics."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from parc.codegen.cli import main
from parc.dsl import load
from parc.codegen.cli.explain import explain, text
from parc.runtime.schedules.schedule import build_schedule

ROOT = Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"
PP2 = ["--set", "parallel.dp=1", "--set", "parallel.pp=2"]
INTERLEAVED = [*PP2, "--set", "parallel.schedule=interleaved(chunks = 2)"]


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def run(capsys, *argv):
    status = main(["explain", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def events(svg_path: Path) -> list[ET.Element]:
    root = ET.parse(svg_path).getroot()
    assert root.tag == f"{SVG}svg"
    return [r for r in root.iter(f"{SVG}rect") if r.get("class", "").startswith("event ")]


def texts(svg_path: Path) -> list[str]:
    return [t.text for t in ET.parse(svg_path).getroot().iter(f"{SVG}text")]


def test_tiny_one_stage(capsys, tmp_path):
    status, out, err = run(capsys, "examples/tiny.par", "-o", str(tmp_path))
    assert (status, err) == (0, "")
    assert "layout         dp 2 × tp 2 (4 ranks)" in out  # train.py's words (codegen/layout_words.py)
    assert "micro-batches  4 per step = global_batch 16 / (micro_batch 2 · dp 2)" in out
    assert "bubble         0.0%" in out
    assert "rank 0 | F0 B0--- F1 B1--- F2 B2--- F3 B3---" in out
    assert f"wrote {tmp_path / 'schedule.svg'}" in out
    assert [p.name for p in tmp_path.iterdir()] == ["schedule.svg"]
    boxes = events(tmp_path / "schedule.svg")
    assert [b.get("class") for b in boxes] == ["event forward", "event backward"] * 4
    assert {"F0", "B3", "forward", "backward", "rank 0"} <= set(texts(tmp_path / "schedule.svg"))


def test_tiny_two_stages_1f1b(capsys, tmp_path):
    status, out, err = run(capsys, "examples/tiny.par", *PP2, "-o", str(tmp_path))
    assert (status, err) == (0, "")
    # (p-1)/(m+p-1) = 1/9 with p = 2 stages and m = 8 micro-batches
    assert "bubble         11.1%: 6 of 2 × 27 time units idle" in out
    assert "in flight      at most rank 0: 2, rank 1: 1 micro-batches" in out
    lines = out.splitlines()
    timeline = lines[lines.index(next(l for l in lines if l.startswith("timeline"))) + 1:][:3]
    assert timeline == [
        "         0              5              10             15             20             25",
        "rank 0 | F0 F1 .  .  B0--- F2 B1--- F3 B2--- F4 B3--- F5 B4--- F6 B5--- F7 B6--- .  B7---",
        "rank 1 | .  F0 B0--- F1 B1--- F2 B2--- F3 B3--- F4 B4--- F5 B5--- F6 B6--- F7 B7--- .  .",
    ]
    assert "rank 1 | ra0<0 F0 B0 sg0>0 ra1<0 F1 B1 sg1>0" in out
    boxes = events(tmp_path / "schedule.svg")
    assert len(boxes) == 2 * 2 * 8  # one box per forward and backward on each rank
    title = texts(tmp_path / "schedule.svg")[0]
    assert title == "examples/tiny.par: 1f1b, 8 micro-batches, bubble 11.1%"


def test_interleaved(capsys, tmp_path):
    status, out, err = run(capsys, "examples/tiny.par", *INTERLEAVED, "-o", str(tmp_path))
    assert (status, err) == (0, "")
    assert "schedule       interleaved(chunks = 2) over 2 pipeline stages (4 virtual stages)" in out
    assert "bubble         5.9%" in out  # (p-1)/(v·m+p-1) = 1/17
    assert "rank 0: 5, rank 1: 3 micro-batch-chunks" in out
    assert "rank 0 | F0.0 F1.0 F0.1 F1.1 F2.0 .    B0.1-----" in out
    boxes = events(tmp_path / "schedule.svg")
    assert len(boxes) == 2 * 2 * 8 * 2
    fills = {(b.get("class"), b.get("fill")) for b in boxes}
    assert len(fills) == 4  # forward/backward × two chunk shades
    assert {"F7.1", "B0.0", "forward chunk 1", "box: micro-batch.chunk"} <= set(texts(tmp_path / "schedule.svg"))


def test_gpipe_boxes_match_the_schedule(capsys, tmp_path):
    status, out, _ = run(capsys, "examples/tiny.par", *PP2, "--set", "parallel.schedule=gpipe",
                         "-o", str(tmp_path))
    assert status == 0
    assert "rank 0: 8, rank 1: 8 micro-batches" in out
    boxes = events(tmp_path / "schedule.svg")
    schedule = build_schedule("gpipe", stages=2, micro_batches=8)
    assert len(boxes) == sum(1 for actions in schedule for a in actions if a.op.value in "FB")
    widths = sorted({float(b.get("width")) for b in boxes})
    assert len(widths) == 2 and widths[1] == pytest.approx(2 * widths[0])  # backward = 2 forwards


def test_svg_bytes_are_deterministic(capsys, tmp_path):
    for folder in ("a", "b"):
        assert run(capsys, "examples/tiny.par", *INTERLEAVED, "-o", str(tmp_path / folder))[0] == 0
    first = (tmp_path / "a" / "schedule.svg").read_bytes()
    assert first == (tmp_path / "b" / "schedule.svg").read_bytes()
    assert str(tmp_path).encode() not in first  # no absolute paths


def test_default_folder_is_the_current_one_and_replaces_only_its_own_chart(capsys, tmp_path, monkeypatch):
    spec = tmp_path / "tiny.par"
    spec.write_bytes((ROOT / "examples" / "tiny.par").read_bytes())
    (tmp_path / "schedule.svg").write_text("old")
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    status, out, err = run(capsys, "tiny.par")  # a schedule.svg of somebody else's: kept
    assert status == 1 and out == "" and "schedule.svg exists and was not written by parc explain" in err
    assert "hint: move it, or write the chart elsewhere with -o DIR" in err
    assert (tmp_path / "schedule.svg").read_text() == "old"
    (tmp_path / "schedule.svg").unlink()
    for _ in range(2):  # written, then replaced: it is its own
        status, out, _ = run(capsys, "tiny.par")
        assert status == 0 and out.endswith("\nwrote schedule.svg\n")
    assert (tmp_path / "schedule.svg").read_text().startswith("<?xml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "schedule.svg", "tiny.par"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_hostile_file_name_is_escaped_in_the_svg(capsys, tmp_path):
    spec = tmp_path / "<b>&x.par"
    spec.write_bytes((ROOT / "examples" / "tiny.par").read_bytes())
    assert run(capsys, str(spec), "-o", str(tmp_path))[0] == 0
    title = texts(tmp_path / "schedule.svg")[0]
    assert title.startswith(f"{spec}: 1f1b")


def test_bad_spec_gives_diagnostics_and_exit_1(capsys, tmp_path):
    status, out, err = run(capsys, "examples/tiny.par", "--set", "parallel.pp=2", "-o", str(tmp_path))
    assert status == 1 and out == ""
    assert "error[PAR0201]" in err and "hint:" in err
    assert not (tmp_path / "schedule.svg").exists()


def test_an_auto_layout_is_explained_as_the_planners_winner(capsys, tmp_path):
    from parc.codegen.lower import lower
    from parc.codegen.render import layout_words

    status, out, err = run(capsys, "examples/tiny.par", "--set", "parallel=auto", "-o", str(tmp_path))
    assert status == 0, err
    spec = explain(load("examples/tiny.par", ["parallel=auto"])).spec
    par = spec.parallel
    # the words train.py's docstring says for the same layout
    assert f"  layout         {layout_words(lower(spec))} ({spec.mesh.nodes * spec.mesh.devices_per_node} ranks)" in out
    assert ("  planner        chose the auto values, as parc build would "
            "(parc plan examples/tiny.par ranks them)\n") in out
    # the layout parc build generates for the same spec
    plan = lower(load("examples/tiny.par", ["parallel=auto"]))
    assert {a.axis: a.size for a in plan.mesh.axes} == {"dp": par.dp, "cp": par.cp, "tp": par.tp, "pp": par.pp}
    status, out, _ = run(capsys, "examples/tiny.par", "--set", "train.micro_batch=auto", "-o", str(tmp_path))
    assert status == 0 and "  planner        chose the auto values" in out
    assert (tmp_path / "schedule.svg").exists()


def test_long_schedules_are_summarized_and_one_is_singular(capsys, tmp_path):
    many = [*PP2, "--set", "train.global_batch=512", "--set", "train.micro_batch=1"]
    status, out, _ = run(capsys, "examples/tiny.par", *many, "-o", str(tmp_path))
    assert status == 0
    assert max(len(line) for line in out.splitlines() if line.lstrip().startswith(("rank", "|"))) <= 100
    assert "timeline (1539 time units, too wide to draw here: see schedule.svg)\n" in out
    assert "rank 0 | busy 1536, idle 3: 0 before its first action, 0 after its last\n" in out
    assert "… 2000 more …" in out
    status, out, _ = run(capsys, "examples/tiny.par", "--set", "train.global_batch=4", "--set", "parallel.dp=4",
                         "--set", "parallel.tp=1", "--set", "train.micro_batch=1", "-o", str(tmp_path))
    assert status == 0 and "at most rank 0: 1 micro-batch (forward done" in out
    assert "1 micro-batch, bubble" in (tmp_path / "schedule.svg").read_text()


def test_missing_file_is_a_usage_error(capsys, tmp_path):
    status, out, err = run(capsys, str(tmp_path / "nope.par"))
    assert status == 2 and err.startswith("parc: error: cannot read")


def test_explain_api_matches_the_simulation():
    ex = explain(load("examples/tiny.par", ["parallel.dp=1", "parallel.pp=2"]))
    assert (ex.kind, ex.stages, ex.micro_batches, ex.chunks) == ("1f1b", 2, 8, 1)
    assert ex.bubble == pytest.approx(1 / 9)
    assert ex.in_flight == (2, 1)


def test_no_traceback_from_the_command_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "parc.codegen.cli", "explain", "examples/tiny.par", "--set", "parallel.tp=3",
         "-o", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "error[PAR0" in done.stderr


def test_zero_bubble_draws_b_and_w_apart(capsys, tmp_path):
    status, out, err = run(capsys, "examples/tiny.par", *PP2, "--set", "parallel.schedule=zero_bubble",
                           "-o", str(tmp_path))
    assert (status, err) == (0, "")
    assert "schedule       zero_bubble over 2 pipeline stages" in out
    # ZB-H1 idles (p-1)(F+B-W) = 1 unit per rank here, 1f1b (p-1)(F+B+W) = 3
    assert "bubble         4.0%: 2 of 2 × 25 time units idle (forward = 1, backward = 2 per chunk as B 1 + W 1" in out
    assert "in flight      at most rank 0: 2, rank 1: 2 micro-batches (forward done, W not yet)" in out
    assert "rank 1 | .  F0 B0 F1 B1 W0 F2 B2 W1" in out
    boxes = events(tmp_path / "schedule.svg")
    kinds = [b.get("class") for b in boxes]
    assert kinds.count("event weight") == kinds.count("event backward") == 2 * 8
    fills = {b.get("class"): b.get("fill") for b in boxes}
    assert len(set(fills.values())) == 3  # F, B and W in three colours
    assert {"input grad B", "weight grad W"} <= set(texts(tmp_path / "schedule.svg"))


def test_explain_draws_chimera_in_two_directions():
    ex = explain(load("examples/tiny.par", ["parallel.dp=1", "parallel.pp=2", "parallel.schedule=chimera"]))
    assert (ex.kind, ex.stages, ex.chunks) == ("chimera", 2, 2)
    assert ex.schedule.placement.kind == "chimera"
    words = text(ex)
    assert "in two directions" in words and "chunk 1 stage p-1-r of the up one" in words
    # even micro-batches run down (chunk 0), odd ones up (chunk 1), on every rank
    events = [e for rank in ex.timeline.ranks for e in rank]
    assert {(e.micro % 2, e.chunk) for e in events} == {(0, 0), (1, 1)}


def test_explain_zero_bubble_v_names_the_v():
    ex = explain(load("examples/tiny.par", ["parallel.dp=1", "parallel.pp=2", "parallel.schedule=zero_bubble_v"]))
    assert (ex.kind, ex.chunks, ex.schedule.placement.kind) == ("zero_bubble_v", 2, "v")
    assert "in a V" in text(ex) and ex.in_flight == (4, 4)


def test_explain_draws_terapipe_slices(tmp_path):
    sets = ["parallel.dp=1", "parallel.pp=2", "parallel.schedule=terapipe(slices = 2)"]
    ex = explain(load("examples/tiny.par", sets))
    assert (ex.kind, ex.slices, ex.schedule_text) == ("terapipe", 2, "terapipe(slices = 2)")
    assert ex.in_flight == (3, 2)  # 1F1B's p - r plus S - 1 slices
    words = text(ex)
    assert "F0.1" in words and "2 slices (forward done" in words
    # per slice F = 1, B = 2: each rank idles (p-1)(F+B) = 3 units, as 1F1B over slices
    assert ex.timeline.makespan == 3 * 8 * 2 + 3
    # every micro-batch's slice 1 runs backward before its slice 0, on every rank
    for events in ex.timeline.ranks:
        backwards = [(e.micro, e.chunk) for e in events if e.op.value == "B"]
        assert backwards == [(m, j) for m in range(8) for j in (1, 0)]
    assert main(["explain", "examples/tiny.par", *[a for s in sets for a in ("--set", s)], "-o", str(tmp_path)]) == 0
    assert {"forward slice 0", "backward slice 1", "box: micro-batch.slice"} <= set(texts(tmp_path / "schedule.svg"))


def test_explain_draws_uneven_terapipe_slices_by_their_tokens():
    sets = ["parallel.dp=1", "parallel.pp=2", "parallel.schedule=terapipe(slices = [32, 16, 16])"]
    ex = explain(load("examples/tiny.par", sets))
    assert (ex.slices, ex.schedule_text) == (3, "terapipe(slices = [32, 16, 16])")
    for events in ex.timeline.ranks:  # slice 0 holds half the tokens: 1.5 mean slices' time
        forwards = {e.chunk: e.end - e.start for e in events if e.op.value == "F" and e.micro == 0}
        assert forwards == pytest.approx({0: 1.5, 1: 0.75, 2: 0.75})
    assert "scaled by its tokens" in text(ex)


def test_one_layout_description_names_every_axis_and_option():
    """cp and its kind, the tp grid, ep/etp, sp, ZeRO, the schedule, recompute, overlap and
    compression: the same words in parc explain, train.py's docstring and the banner."""
    from parc.codegen.layout_words import Words, words

    assert words(Words(degrees={"dp": 1, "cp": 1, "tp": 1, "pp": 1})) == "one rank"
    assert words(Words(
        degrees={"dp": 2, "cp": 2, "tp": 4, "pp": 2}, options={"cp_kind": "ulysses", "tp_shape": (2, 2), "etp": 2},
        ep=2, sp=True, zero=1,
        schedule="interleaved(2)", settings={"recompute": "selective", "overlap": 2}, compress="powersgd",
    )) == ("pp 2 × dp 2 × cp 2 (ulysses) × tp 4 (2×2) + ep 2 + etp 2 + sequence parallel + ZeRO-1 + interleaved(2)"
           " + recompute selective + sub_batch(2) + compress powersgd")
    assert words(Words(degrees={"dp": 2}, settings={"recompute": ("full", "full", "none")})) == (
        "dp 2 + recompute [full ×2, none]")
