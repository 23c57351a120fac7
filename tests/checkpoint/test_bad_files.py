"""The trainer meets a bad file or folder: one line from rank 0, exit 1, no traceback, nothing lost.

One real checkpoint (one rank, one step) is copied and damaged in each way a
checkpoint from elsewhere can be: ``parc.json`` of the wrong shape, a DCP index that
would run code as it unpickles or names a data file outside the checkpoint, a
``step_*`` entry leading out; and ``--resume``/``--checkpoint-dir``/``--metrics-jsonl``
naming a file, a folder or nothing. Token files (``data = tokens(...)``) are checked
whole before the first step. The CLI's side is ``tests/codegen/test_readers.py``.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest
from torch.distributed.checkpoint.filesystem import FileSystemReader

from .trainer import build, run


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A one-rank build and its checkpoint after one step."""
    out = tmp_path_factory.mktemp("bad_files")
    build_dir = build("one", out / "build")
    run(build_dir, 1, ["--steps", "1", "--checkpoint-dir", str(out / "ck")])
    return build_dir, out / "ck" / "step_000001"


def refused(build_dir, args) -> str:
    """The one line the trainer ends with (checked: exit 1, no traceback)."""
    done = run(build_dir, 1, ["--steps", "2", *map(str, args)], expect=1)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "step     1" not in done.stdout  # refused before training
    return done.stderr.strip().splitlines()[-1]


def copy_of(saved, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(saved[1], folder / "step_000001")
    return folder, folder / "step_000001"


def test_resume_and_checkpoint_dir_that_are_not_folders(saved, tmp_path):
    build_dir, _ = saved
    (tmp_path / "file").write_text("precious")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert refused(build_dir, ["--resume", tmp_path / "file"]) == (
        f"train.py: --resume {tmp_path / 'file'} is a file, not a checkpoint folder")
    assert refused(build_dir, ["--resume", tmp_path / "dangling"]) == (
        f"train.py: --resume {tmp_path / 'dangling'} is a symlink to nothing ({tmp_path / 'gone'})")
    assert refused(build_dir, ["--resume", tmp_path / "missing"]) == (
        f"train.py: --resume {tmp_path / 'missing'}: no such folder")
    assert refused(build_dir, ["--checkpoint-dir", tmp_path / "file"]) == (
        f"train.py: --checkpoint-dir {tmp_path / 'file'} exists and is not a folder")
    assert refused(build_dir, ["--checkpoint-dir", tmp_path / "file" / "ck"]) == (
        f"train.py: --checkpoint-dir cannot make {tmp_path / 'file' / 'ck'}: {tmp_path / 'file'} is a file, not a folder")
    assert (tmp_path / "file").read_text() == "precious"


def test_a_step_folder_leading_out_is_refused(saved, tmp_path):
    build_dir, step = saved
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "step_000009").symlink_to(step)
    line = refused(build_dir, ["--checkpoint-dir", tmp_path / "ck"])  # looked for before a fresh start
    assert line == (f"train.py: --checkpoint-dir {tmp_path / 'ck'}: 'step_000009' leads outside the folder "
                    f"(through a symlink, to {step}): not reading it")


@pytest.mark.parametrize("change, problem", [
    (lambda info: [info], "parc.json: must be an object, not list"),
    (lambda info: dict(info, optimizer_step=-1), 'parc.json: ["optimizer_step"]: must be >= 0, not -1'),
    (lambda info: dict(info, model=dict(info["model"], layers="2")),
     'parc.json: ["model"]["layers"]: must be a whole number, not \'2\''),
])
def test_parc_json_of_the_wrong_shape(saved, tmp_path, change, problem):
    folder, step = copy_of(saved, tmp_path)
    info = json.loads((step / "parc.json").read_text())
    (step / "parc.json").write_text(json.dumps(change(info)))
    assert refused(saved[0], ["--resume", folder]) == f"train.py: {step / problem}"


class Payload:
    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def test_an_index_that_would_run_code_is_not_unpickled(saved, tmp_path):
    folder, step = copy_of(saved, tmp_path)
    (step / ".metadata").write_bytes(pickle.dumps(Payload(tmp_path / "SENTINEL")))
    assert refused(saved[0], ["--resume", folder]) == (
        f"train.py: {step}/.metadata is not a DCP index: UnpicklingError: it names posix.system, "
        "which a DCP index never holds")
    assert not (tmp_path / "SENTINEL").exists()


def test_an_index_naming_a_file_outside_is_refused(saved, tmp_path):
    folder, step = copy_of(saved, tmp_path)
    index = FileSystemReader(str(step)).read_metadata()  # our own file: safe to unpickle here
    for key, item in index.storage_data.items():
        index.storage_data[key] = type(item)(relative_path="../../secret", offset=item.offset, length=item.length,
                                             transform_descriptors=None)
    (step / ".metadata").write_bytes(pickle.dumps(index))
    assert refused(saved[0], ["--resume", folder]) == (
        f"train.py: {step}/.metadata names a data file outside the checkpoint: '../../secret' is not a plain "
        "path inside the folder ('..', '.' or an empty part)")


def test_a_truncated_data_file(saved, tmp_path):
    folder, step = copy_of(saved, tmp_path)
    data = step / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:1000])
    line = refused(saved[0], ["--resume", folder])
    assert line.startswith(f"train.py: {step}: cannot read its tensors, the data files are damaged (")


def test_metrics_jsonl_that_cannot_be_written(saved, tmp_path):
    (tmp_path / "file").write_text("x")
    assert refused(saved[0], ["--metrics-jsonl", tmp_path]) == (
        f"train.py: --metrics-jsonl {tmp_path} is a folder, not a file")
    assert refused(saved[0], ["--metrics-jsonl", tmp_path / "file" / "m.jsonl"]) == (
        f"train.py: --metrics-jsonl cannot make {tmp_path / 'file' / 'm.jsonl'}: {tmp_path / 'file'} is a file, "
        "not a folder")


def test_token_files_are_checked_before_training(tmp_path):
    build_dir = build("one", tmp_path / "build", extra=('train.data=tokens("t.bin")',))
    good = (b"\x01\x00" * 100)
    cases = {
        "missing": (None, "no such file"),
        "folder": ("mkdir", "is a folder, not a file"),
        "empty": (b"", "0 tokens, fewer than seq_len + 2 = 34"),
        "odd.bin": (good + b"\x01", "201 bytes is not a whole number of uint16 tokens (2 bytes each)"),
        "big_ids.bin": (good + b"\xfa\x00", "holds token id 250, but the model's vocab is 250 (ids 0..249)"),
        "/dev/zero": ("/dev/zero", "is not a regular file (a device, pipe or socket)"),
    }
    for name, (content, words) in cases.items():
        path = tmp_path / name
        if content == "mkdir":
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path = content
        line = refused(build_dir, ["--data", path])
        assert line.startswith(f"train.py: --data {path}") and words in line, (name, line)
