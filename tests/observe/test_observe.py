"""Watching a run: banner, TensorBoard scalars, checkpoint lines, profiler trace, parc report.

One real run of a one-rank trainer built from a spec with ``log = tensorboard("tb")``,
read back through the tools a user has: tensorboard's own event reader, the Chrome
trace JSON, and ``parc report``'s PNGs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parc.codegen.build import build_to
from parc.codegen.cli import main as parc_main
from parc.runtime.train.observe import banner_lines, parse_steps, scalars

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3

SPEC = (ROOT / "examples" / "tiny.par").read_text()
SPEC = SPEC.replace("devices_per_node = 4", "devices_per_node = 1")
SPEC = SPEC.replace("dp = 2", "dp = 1").replace("tp = 2", "tp = 1")
SPEC = SPEC.replace("global_batch = 16", "global_batch = 4").replace("  data = synthetic\n", '  data = synthetic\n  log = tensorboard("tb")\n')


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The trainer built and run once for 3 steps with every observability flag."""
    tmp = tmp_path_factory.mktemp("observe")
    spec = tmp / "one.par"
    spec.write_text(SPEC)
    out = build_to(spec, tmp / "build")
    command = [sys.executable, "train.py", "--steps", str(STEPS), "--metrics-jsonl", "run.jsonl",
               "--profile", "2-3", "--checkpoint-dir", "ck"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-6000:]}"
    return out, done.stdout


def test_spec_log_tensorboard_is_the_default_of_the_flag(run):
    out, _ = run
    text = (out / "train.py").read_text()
    assert "TENSORBOARD_DIR = 'tb'  # one.par:" in text.replace('"', "'")


def test_banner_and_checkpoint_lines(run):
    _, stdout = run
    lines = stdout.splitlines()
    assert lines[0] == "parc trainer: gpt_tiny: gpt with 867,072 parameters, one rank."
    assert "  layout      one rank (1 rank(s))" in lines
    assert "  parameters  0.9M total, 0.9M per rank" in lines
    assert "  data        synthetic tokens (seed 1234)" in lines
    assert "  checkpoints ck" in lines
    assert "  tensorboard tb" in lines
    assert f"checkpoint saved: step {STEPS} in ck/step_{STEPS:06d}" in lines


def test_tensorboard_events_hold_every_logged_scalar(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = run
    records = [json.loads(line) for line in (out / "run.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = set()
    for record in records:
        expected |= set(scalars(record))
    assert {"loss", "grad_norm", "lr", "tokens_per_s", "memory_per_rank/rank0/param_bytes"} <= expected
    assert expected == tags
    for tag in sorted(expected):
        logged = {r["step"]: scalars(r)[tag] for r in records if tag in scalars(r)}
        read = {e.step: e.value for e in events.Scalars(tag)}
        assert read.keys() == logged.keys(), tag
        for step, value in logged.items():
            assert read[step] == pytest.approx(value, rel=1e-6), (tag, step)  # float32 in the file


def test_profiler_trace_is_chrome_json_with_step_markers(run):
    out, stdout = run
    trace = json.loads((out / "profile" / "trace-rank0.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert {"ProfilerStep#2", "ProfilerStep#3"} <= names
    assert "ProfilerStep#1" not in names
    assert "profiler trace of steps 2-3 written to profile/trace-rank*.json" in stdout


def test_parc_report_writes_pngs(run, tmp_path, capsys):
    out, _ = run
    assert parc_main([ "report", str(out / "run.jsonl"), "-o", str(tmp_path / "report")]) == 0
    for name in ("loss", "tokens_per_s", "exposed_comm", "memory_per_rank"):
        png = (tmp_path / "report" / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000, name


def test_parc_report_refuses_a_file_that_is_not_metrics(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "loss": 2.0}\nnot json\n')
    assert parc_main(["report", str(bad), "-o", str(tmp_path / "r")]) == 1
    assert f"{bad}:2: not a JSON object" in capsys.readouterr().err


def test_missing_tensorboard_is_one_clear_line(tmp_path):
    """The trainer needs only torch: without the tensorboard package, --tensorboard says so."""
    code = (
        "import sys; sys.modules['tensorboard'] = None\n"
        "from parc.runtime.train.metrics import MetricsLogger\n"
        f"MetricsLogger(None, enabled=True, tensorboard={str(tmp_path / 'tb')!r})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "--tensorboard needs the tensorboard package, which is not installed" in done.stderr
    assert "Traceback" not in done.stderr


def test_banner_lines_show_prediction_and_uneven_shards():
    lines = banner_lines(
        title="m: llama", layout="pp 2", parameters=10_000_000, parameters_per_rank=[6_000_000, 4_000_000],
        data="token file x.bin (uint16)", checkpoint_dir=None, predicted_step_time_s=0.5,
        predicted_mem_bytes=3 * 2**30,
    )
    assert lines[2] == "  parameters  10.0M total, 4.0M–6.0M per rank"
    assert lines[3] == "  predicted   3,072 MiB peak per rank, 0.500 s per step (the planner's, plan.json)"
    assert lines[5] == "  checkpoints none (--checkpoint-dir DIR)"


def test_profile_steps_parse():
    assert parse_steps("4") == (4, 4)
    assert parse_steps("2-5") == (2, 5)
    for bad in ("0", "5-2", "x", "1-"):
        with pytest.raises(SystemExit):
            parse_steps(bad)


def test_memory_is_measured_on_first_every_nth_and_last_steps():
    from parc.runtime.train.memory import measured

    steps = [s for s in range(1, 26) if measured(s, every=10, first=1, last=25)]
    assert steps == [1, 2, 10, 20, 25]
    assert [s for s in range(6, 10) if measured(s, every=1, first=6, last=9)] == [6, 7, 8, 9]
    assert [s for s in range(6, 30) if measured(s, every=0, first=6, last=29)] == [6, 7, 29]  # a resumed run


def test_steps_that_do_not_measure_memory_log_no_memory_fields(run):
    out, _ = run
    records = [json.loads(line) for line in (out / "run.jsonl").read_text().splitlines()]
    assert [("memory_per_rank" in r) for r in records] == [True, True, True]  # steps 1, 2 and the last
