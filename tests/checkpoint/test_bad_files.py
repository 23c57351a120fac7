"""The trainer meets a bad file or folder: one line from rank 0, exit 1, no traceback, nothing lost.

One real checkpoint (one rank, one step) is copied and damaged in each way a
checkpoint from elsewhere can be: ``parc.json`` of the wrong shape, a DCP index that
would run code as it unpickles or names a data file outside the checkpoint, a
``step_*`` entry leading out; and ``--resume``/``--checkpoint-dir``/``--metrics-jsonl``
naming a file, a folder or nothing. Token files (``data = tokens(...)``) are checked
whole before the first step. The CLI's side is ``tests/codegen/test_readers.py``.

Every refusal is a case of one batch launch (tests/parity/batch.py, ``exit_status=1``):
``damage_worker.py`` lays out its damaged input in the build's ``scratch/`` folder just
before the trainer runs, after the run that saved the checkpoint it damages.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.batch import Case

from .trainer import overrides

DAMAGE_WORKER = str(Path(__file__).with_name("damage_worker.py"))
SAVED = Case("bad-files-saved", "gpt.par", tuple(overrides("one")), 1, ("--steps", "1", "--checkpoint-dir", "{build}/ck"))
SOURCE = "--source={build:bad-files-saved}/ck/step_000001"
TOKENS = ('train.data=tokens("t.bin")',)

REFUSED = {  # name -> (damage, trainer flags with {scratch}, extra overrides)
    "resume-file": ("files", ["--resume", "{scratch}/file"], ()),
    "resume-dangling": ("files", ["--resume", "{scratch}/dangling"], ()),
    "resume-missing": ("files", ["--resume", "{scratch}/missing"], ()),
    "ckdir-file": ("files", ["--checkpoint-dir", "{scratch}/file"], ()),
    "ckdir-under-file": ("files", ["--checkpoint-dir", "{scratch}/file/ck"], ()),
    "leading-out": ("leading-out", ["--checkpoint-dir", "{scratch}/ck"], ()),
    "json-list": ("json-list", ["--resume", "{scratch}/copy"], ()),
    "json-step": ("json-step", ["--resume", "{scratch}/copy"], ()),
    "json-layers": ("json-layers", ["--resume", "{scratch}/copy"], ()),
    "pickle": ("pickle", ["--resume", "{scratch}/copy"], ()),
    "outside": ("outside", ["--resume", "{scratch}/copy"], ()),
    "truncated": ("truncated", ["--resume", "{scratch}/copy"], ()),
    "metrics-folder": ("files", ["--metrics-jsonl", "{scratch}"], ()),
    "metrics-under-file": ("files", ["--metrics-jsonl", "{scratch}/file/m.jsonl"], ()),
    **{f"tokens-{name}": ("tokens", ["--data", path], TOKENS) for name, path in (
        ("missing", "{scratch}/missing"), ("folder", "{scratch}/folder"), ("empty", "{scratch}/empty"),
        ("odd", "{scratch}/odd.bin"), ("big-ids", "{scratch}/big_ids.bin"), ("device", "/dev/zero"))},
}


def refusal(name: str) -> Case:
    damage, flags, extra = REFUSED[name]
    return Case(f"bad-files-{name}", "gpt.par", tuple(overrides("one", extra)), 1,
                (f"--damage={damage}", SOURCE, "--steps", "2", *(f.replace("{scratch}", "{build}/scratch") for f in flags)),
                phase=1, script=DAMAGE_WORKER, exit_status=1)


def cases_of(item) -> list[Case]:
    """The runs a selected test of this module reads (tests/conftest.py's ``trainers``)."""
    names = getattr(item.function, "refusals", ())
    return [SAVED, *map(refusal, names)] if names else []


def reads(*names):
    def mark(test):
        test.refusals = names
        return test
    return mark


@pytest.fixture
def refused(trainers):
    """``refused(name)``: (the one line the trainer ended with, its scratch folder), checked: it
    exited 1 (the batch checks), with no traceback, before its first step."""

    def get(name: str) -> tuple[str, Path]:
        done = trainers.run(refusal(name))
        log = done.log.read_text()
        assert "Traceback" not in log, log[-3000:]
        assert "step     1" not in log  # refused before training
        return log.strip().splitlines()[-1], done.build / "scratch"

    return get


@reads("resume-file", "resume-dangling", "resume-missing", "ckdir-file", "ckdir-under-file")
def test_resume_and_checkpoint_dir_that_are_not_folders(refused):
    line, s = refused("resume-file")
    assert line == f"train.py: --resume {s / 'file'} is a file, not a checkpoint folder"
    line, s = refused("resume-dangling")
    assert line == f"train.py: --resume {s / 'dangling'} is a symlink to nothing ({s / 'gone'})"
    line, s = refused("resume-missing")
    assert line == f"train.py: --resume {s / 'missing'}: no such folder"
    line, s = refused("ckdir-file")
    assert line == f"train.py: --checkpoint-dir {s / 'file'} exists and is not a folder"
    assert (s / "file").read_text() == "precious"
    line, s = refused("ckdir-under-file")
    assert line == f"train.py: --checkpoint-dir cannot make {s / 'file' / 'ck'}: {s / 'file'} is a file, not a folder"
    assert (s / "file").read_text() == "precious"


@reads("leading-out")
def test_a_step_folder_leading_out_is_refused(refused, trainers):
    step = trainers.run(SAVED).build / "ck" / "step_000001"
    line, s = refused("leading-out")  # looked for before a fresh start
    assert line == (f"train.py: --checkpoint-dir {s / 'ck'}: 'step_000009' leads outside the folder "
                    f"(through a symlink, to {step}): not reading it")


@reads("json-list", "json-step", "json-layers")
@pytest.mark.parametrize("name, problem", [
    ("json-list", "parc.json: must be an object, not list"),
    ("json-step", 'parc.json: ["optimizer_step"]: must be >= 0, not -1'),
    ("json-layers", 'parc.json: ["model"]["layers"]: must be a whole number, not \'2\''),
])
def test_parc_json_of_the_wrong_shape(refused, name, problem):
    line, s = refused(name)
    assert line == f"train.py: {s / 'copy' / 'step_000001' / problem}"


@reads("pickle")
def test_an_index_that_would_run_code_is_not_unpickled(refused):
    line, s = refused("pickle")
    step = s / "copy" / "step_000001"
    assert line == (f"train.py: {step}/.metadata is not a DCP index: UnpicklingError: it names posix.system, "
                    "which a DCP index never holds")
    assert not (s / "SENTINEL").exists()


@reads("outside")
def test_an_index_naming_a_file_outside_is_refused(refused):
    line, s = refused("outside")
    assert line == (f"train.py: {s / 'copy' / 'step_000001'}/.metadata names a data file outside the checkpoint: "
                    "'../../secret' is not a plain path inside the folder ('..', '.' or an empty part)")


@reads("truncated")
def test_a_truncated_data_file(refused):
    line, s = refused("truncated")
    assert line.startswith(f"train.py: {s / 'copy' / 'step_000001'}: cannot read its tensors, the data files are damaged (")


@reads("metrics-folder", "metrics-under-file")
def test_metrics_jsonl_that_cannot_be_written(refused):
    line, s = refused("metrics-folder")
    assert line == f"train.py: --metrics-jsonl {s} is a folder, not a file"
    line, s = refused("metrics-under-file")
    assert line == (f"train.py: --metrics-jsonl cannot make {s / 'file' / 'm.jsonl'}: {s / 'file'} is a file, "
                    "not a folder")


TOKEN_CASES = {
    "missing": "no such file",
    "folder": "is a folder, not a file",
    "empty": "0 tokens, fewer than seq_len + 2 = 34",
    "odd": "201 bytes is not a whole number of uint16 tokens (2 bytes each)",
    "big-ids": "holds token id 250, but the model's vocab is 250 (ids 0..249)",
    "device": "is not a regular file (a device, pipe or socket)",
}


@reads(*(f"tokens-{name}" for name in TOKEN_CASES))
def test_token_files_are_checked_before_training(refused):
    for name, words in TOKEN_CASES.items():
        line, s = refused(f"tokens-{name}")
        path = REFUSED[f"tokens-{name}"][1][1].replace("{scratch}", str(s))
        assert line.startswith(f"train.py: --data {path}") and words in line, (name, line)
