"""``parc plan``: the table as a user sees it (exact text), --json's keys, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parc.codegen.cli import main

HERE = Path(__file__).parent
SMALL = str(HERE / "specs" / "plan_small.par")


def test_table_exact_text(capsys, monkeypatch):
    monkeypatch.chdir(HERE.parent.parent)
    assert main(["plan", "tests/planner/specs/plan_small.par", "--top", "3"]) == 0
    assert capsys.readouterr().out == (HERE / "plan_small.txt").read_text(encoding="utf-8")


def test_json_keys(capsys):
    assert main(["plan", SMALL, "--top", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"accounting", "best_uniform_step_time_s", "considered", "fitting", "layouts", "mesh",
                         "model", "parameters", "spec", "why", "winner"}
    assert data["winner"] == 0 and len(data["layouts"]) == 2 and data["considered"] > 100
    layout = data["layouts"][0]
    # every field of the planner's Layout (the table's columns: cp, cp_kind, ep, etp, tp_shape,
    # compress and terapipe's slices included), then the estimate's
    assert set(layout) == {
        "dp", "tp", "pp", "sp", "zero", "schedule", "chunks", "micro_batch", "recompute", "overlap", "cp", "cp_kind",
        "compress", "ep", "etp", "tp_shape", "slices", "grad_accum", "step_time_s", "tokens_per_s",
        "tflops_per_device", "mfu", "peak_mem_bytes", "fits", "buildable", "peak_pipeline_rank", "time", "memory"}
    assert set(layout["time"]) == {"compute_s", "exposed_comm_s", "bubble_s", "tp_comm_s", "dp_comm_s", "pp_comm_s",
                                   "ep_comm_s"}
    time, memory = layout["time"], layout["memory"]
    assert abs(time["compute_s"] + time["exposed_comm_s"] + time["bubble_s"] - layout["step_time_s"]) < 1e-9
    assert abs(sum(memory.values()) - layout["peak_mem_bytes"]) < 1.0
    assert data["layouts"][0]["step_time_s"] <= data["layouts"][1]["step_time_s"]


def test_fixed_layout_is_evaluated_alone(capsys):
    assert main(["plan", "examples/tiny.par"]) == 0
    out = capsys.readouterr().out
    assert "1 layout considered" in out and "the spec gives its layout: dp 2 · tp 2 · pp 1." in out


def test_set_fixes_a_key_in_the_table(capsys):
    assert main(["plan", SMALL, "--set", "parallel.tp=2", "--json", "--top", "0"]) == 0
    layouts = json.loads(capsys.readouterr().out)["layouts"]
    assert layouts and {row["tp"] for row in layouts} == {2}


def test_missing_profile_is_an_error_not_a_trace(capsys, tmp_path):
    assert main(["plan", "examples/tiny.par", "--set", 'mesh.profile="nope.json"', "--set", "parallel=auto"]) == 1
    err = capsys.readouterr().err
    assert "cannot read the profile" in err and "Traceback" not in err
    assert err.startswith("--set 1:1:14: error[PAR0804]") and "hint: run parc profile" in err


def test_a_file_that_is_not_a_profile_is_quoted_at_its_spec_line(capsys, tmp_path):
    spec = tmp_path / "p.par"
    spec.write_text(Path("examples/tiny.par").read_text().replace("  device = cpu\n", '  device = cpu\n  profile = "bad.json"\n'))
    (tmp_path / "bad.json").write_text('{"bad": 1}')
    assert main(["plan", str(spec)]) == 1
    err = capsys.readouterr().err
    line = next(i for i, text in enumerate(spec.read_text().splitlines(), 1) if "profile" in text)
    assert err.startswith(f"{spec}:{line}:13: error[PAR0804]") and "is not a parc profile" in err
    # parc build of an auto spec says the same, and writes nothing
    assert main(["build", str(spec), "-o", str(tmp_path / "out"), "--set", "parallel=auto"]) == 1
    assert capsys.readouterr().err.startswith(f"{spec}:{line}:13: error[PAR0804]")
    assert not (tmp_path / "out").exists()


def test_help_says_megatron_accounting_changes_the_time_model_too(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "which training program the figures describe, memory and time both" in text
    assert "a different time model too: attention without flash" in text
