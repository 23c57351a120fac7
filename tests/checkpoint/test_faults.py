"""A long run's accidents: a rank dying, SIGTERM, non-finite numbers, a wrong checkpoint.

- Fault: launch.sh (torchrun ``--max-restarts 1``) with the last rank killed at step 6 (checkpoint
  every 4) restarts, resumes from step 4 by itself, repeats only step 5, and ends
  with the clean run's losses; ``--checkpoint-keep 1`` leaves only the last checkpoint.
- SIGTERM to the whole job: the step in flight finishes, a complete checkpoint of it
  is written, and the next launch with ``--resume`` starts at the next step.
- ``on_nonfinite = skip``: a NaN loss on one rank makes every rank skip that step's
  update (parameters and AdamW's step count unchanged), and training goes on;
  ``stop`` (the default) exits 1 naming the step and leaves the last checkpoint; a
  fresh start into a folder that holds checkpoints is refused (``--resume`` it).
- A checkpoint of another model shape is refused with the tensor and both shapes.
- Only renamed folders with both files are checkpoints (Note [atomic checkpoints]):
  rank 0 killed while saving, every file written but not renamed, leaves the
  previous checkpoint the latest, and the next save removes the leftover.

The runs that end by themselves inside one process (the non-finite ones, the shape
mismatch) are cases of the checkpoint tests' batch launches (tests/conftest.py's
``trainers``; the refusals through damage_worker.py, whose stdout is line-buffered so a
log ends with the trainer's last line). A rank that dies (``os._exit``), torchrun's
restart and a SIGTERM to the whole job need processes of their own.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from parc.runtime.checkpoints import checkpoint, checkpoint_read

from parity.batch import Case

from .test_resume import straight as straight_case
from .trainer import TORCHRUN, build, command, env, losses, overrides, records, run

DAMAGE_WORKER = str(Path(__file__).with_name("damage_worker.py"))
"""Runs the build's train.py with stdout line-buffered (no --damage: nothing laid out)."""
NAN = (("PARC_NAN_AT_STEP", "3"),)
SKIP = Case("faults-nonfinite-skip", "gpt.par", tuple(overrides("dp2", ("train.on_nonfinite=skip",))), 2,
            ("--steps", "4", "--checkpoint-dir", "{build}/ck", "--checkpoint-every", "1"), env=NAN)
STOP = Case("faults-nonfinite-stop", "gpt.par", tuple(overrides("one")), 1,  # on_nonfinite = stop by default
            ("--steps", "4", "--checkpoint-dir", "{build}/ck", "--checkpoint-every", "2"), env=NAN,
            script=DAMAGE_WORKER, exit_status=1)
STOP_AGAIN = Case("faults-fresh-start-refused", "gpt.par", tuple(overrides("one")), 1,
                  ("--steps", "4", "--checkpoint-dir", "{build:faults-nonfinite-stop}/ck"), phase=1,
                  script=DAMAGE_WORKER, exit_status=1)
SHAPE = Case("faults-shape-mismatch", "gpt.par", tuple(overrides("one", ("model.hidden=128",))), 1,
             ("--steps", "5", "--resume", "{build:straight-dp2}/ck/step_000004"), phase=1,
             script=DAMAGE_WORKER, exit_status=1)


def cases_of(item) -> list[Case]:
    """The runs a selected test of this module reads (tests/conftest.py's ``trainers``)."""
    return {
        "test_nonfinite_skip_keeps_every_rank_in_step": [SKIP],
        "test_nonfinite_stop_names_the_step_and_keeps_the_checkpoint": [STOP, STOP_AGAIN],
        "test_shape_mismatch_is_a_clear_error": [straight_case("dp2"), SHAPE],  # test_resume's run, shared
        "test_fault_restart_resumes_from_latest_checkpoint": [straight_case("dp2")],
        "test_sigterm_saves_and_the_next_launch_resumes": [straight_case("dp2")],
    }.get(item.originalname, [])


def last_line(log: Path) -> str:
    return log.read_text().strip().splitlines()[-1]


def test_fault_restart_resumes_from_latest_checkpoint(trainers, tmp_path):
    clean = trainers.run(straight_case("dp2"))  # test_resume's 8 steps, checkpoints at 4 and 8
    metrics = tmp_path / "metrics.jsonl"
    # the batch's runs take the kernels at every size (tests/conftest.py, Note [eager at small
    # shapes]), from the run's kernel cache: so does this one, to end bit for bit where the clean run ended
    kernels = {key: os.environ[key] for key in ("PARC_KERNELS_EAGER_BELOW", "PARC_KERNEL_CACHE") if key in os.environ}
    done = subprocess.run(  # the generated launch.sh: torchrun --standalone --max-restarts 1
        ["./launch.sh", "--max-restarts", "1", "--steps", "8", "--checkpoint-dir", str(tmp_path / "ck"),
         "--checkpoint-every", "4", "--checkpoint-keep", "1", "--metrics-jsonl", str(metrics)],
        cwd=clean.build, env=env(TORCHRUN=str(TORCHRUN), PARC_FAULT_AT_STEP="6", **kernels),
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "injected fault at step 6" in done.stderr
    assert "step_000004 at step 4" in done.stdout  # the restart found the latest checkpoint itself
    steps = [r["step"] for r in records(metrics)]
    assert sorted(set(steps)) == list(range(1, 9))
    repeated = [s for s in set(steps) if steps.count(s) > 1]
    assert set(repeated) <= {5}, steps  # only the steps after the last checkpoint
    assert steps[-4:] == [5, 6, 7, 8]
    assert losses(records(metrics)) == losses(clean.records)  # bit for bit, the final loss included
    assert os.listdir(tmp_path / "ck") == ["step_000008"]  # --checkpoint-keep 1


def test_sigterm_saves_and_the_next_launch_resumes(trainers, tmp_path):
    build_dir = trainers.run(straight_case("dp2")).build  # its build folder (the run's files stay apart)
    metrics, ck = tmp_path / "metrics.jsonl", tmp_path / "ck"
    args = ["--steps", "100000", "--checkpoint-dir", str(ck), "--checkpoint-every", "0",
            "--metrics-jsonl", str(metrics)]
    job = subprocess.Popen(command(build_dir, 2, args), env=env(), cwd=build_dir, start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (metrics.exists() and len(records(metrics)) >= 3):
            assert job.poll() is None and time.monotonic() < deadline, "the trainer did not start"
            time.sleep(0.2)
        os.killpg(job.pid, signal.SIGTERM)  # as Slurm does: every process of the job
        output, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    last = records(metrics)[-1]["step"]
    assert "SIGTERM: step" in output
    saved = checkpoint.latest(str(ck))
    assert saved is not None and saved.endswith(f"step_{last:06d}"), (saved, last, output[-2000:])
    assert sorted(os.listdir(ck)) == [f"step_{last:06d}"]  # no .tmp left
    metrics.unlink()
    run(build_dir, 2, ["--steps", str(last + 1), "--resume", str(ck), "--metrics-jsonl", str(metrics)])
    assert [r["step"] for r in records(metrics)] == [last + 1]


def test_nonfinite_skip_keeps_every_rank_in_step(trainers):
    done = trainers.run(SKIP)
    log, ck = done.log.read_text(), done.build / "ck"
    assert "step 3: non-finite loss or gradient norm" in log and "optimizer step skipped" in log
    loss = losses(done.records)
    assert math.isnan(loss[3]) and all(math.isfinite(loss[s]) for s in (1, 2, 4))
    two, three, four = (checkpoint_read.read_full(str(ck / f"step_00000{s}")) for s in (2, 3, 4))
    model = [k for k in two if k.startswith(("model.", "optim."))]
    assert all(torch.equal(two[k], three[k]) for k in model)  # no rank updated anything
    assert not torch.equal(three["model.embed.weight"], four["model.embed.weight"])
    assert int(three["optim.step"]) == 2 and int(four["optim.step"]) == 3


def test_nonfinite_stop_names_the_step_and_keeps_the_checkpoint(trainers):
    done = trainers.run(STOP)  # exit 1, as trainers checks (STOP.exit_status)
    log, ck = done.log.read_text(), done.build / "ck"
    assert "train.py: step 3: non-finite loss or gradient norm" in log
    assert "on_nonfinite = stop" in log
    assert sorted(os.listdir(ck)) == ["step_000002"]
    # a fresh start into that folder would later resume another run's checkpoints: refused
    again = trainers.run(STOP_AGAIN)
    assert last_line(again.log) == (
        f"train.py: --checkpoint-dir {ck} already holds {ck / 'step_000002'}: "
        f"pass --resume {ck} to continue from it, or use an empty folder"
    )


def test_shape_mismatch_is_a_clear_error(trainers):
    resume = trainers.run(straight_case("dp2")).build / "ck" / "step_000004"
    done = trainers.run(SHAPE)
    assert last_line(done.log) == (
        f"train.py: checkpoint {resume}: embed.weight has shape (256, 64) there but (256, 128) "
        "in this model: it was saved from a different model (hidden 64 there, 128 here; "
        "head_dim 16 there, 32 here)"
    )


def test_a_crash_while_saving_leaves_the_previous_checkpoint_the_latest(tmp_path):
    build_dir = build("one", tmp_path / "build")
    ck = tmp_path / "ck"
    args = ["--steps", "4", "--checkpoint-dir", str(ck), "--checkpoint-every", "2"]
    done = run(build_dir, 1, args, expect=1, extra_env={"PARC_FAULT_IN_SAVE": "4"})
    assert "injected fault while saving step 4" in done.stderr
    assert sorted(os.listdir(ck / "step_000004.tmp")) == [".metadata", "__0_0.distcp", "parc.json"]
    assert checkpoint.latest(str(ck)) == str(ck / "step_000002")
    done = run(build_dir, 1, [*args, "--resume", str(ck)])
    assert "at step 2" in done.stdout
    assert sorted(os.listdir(ck)) == ["step_000002", "step_000004"]  # the leftover removed


def test_only_complete_renamed_folders_are_checkpoints(tmp_path):
    def make(name, *files):
        (tmp_path / name).mkdir()
        for file in files:
            (tmp_path / name / file).write_text("{}")

    make("step_000002", ".metadata", "parc.json")
    make("step_000004.tmp", ".metadata", "parc.json")  # a save that did not finish renaming
    make("step_000006", ".metadata")  # no parc.json
    make("step_000008")
    assert checkpoint.latest(str(tmp_path)) == str(tmp_path / "step_000002")
    assert checkpoint.resolve(str(tmp_path)) == str(tmp_path / "step_000002")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint there"):
        checkpoint.resolve(str(empty))
