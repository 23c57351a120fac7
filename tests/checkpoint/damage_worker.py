"""Lay out a damaged input in ``BUILD/scratch``, then run the build's train.py (test helper).

    batch_worker.py ... damage_worker.py BUILD [--damage=KIND] [--source=STEP] [train.py flags]

``tests/checkpoint/test_bad_files.py``'s refusals run as cases of one batch launch
(tests/parity/batch.py), so what each one reads must exist when its run starts, after
the run that saved the checkpoint it damages. KIND (``DAMAGES``) writes it into a
fresh ``scratch/`` folder of the build; the trainer then runs as ``python train.py
FLAGS`` would, with stdout line-buffered so the log ends with its last line.
"""

from __future__ import annotations

import os
import pickle
import runpy
import shutil
import sys
from pathlib import Path


class Payload:
    """Unpickling it would run ``touch SENTINEL``."""

    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def _copy(source: Path, scratch: Path) -> Path:
    step = scratch / "copy" / source.name
    shutil.copytree(source, step)
    return step


def _json(change):
    def damage(source: Path, scratch: Path) -> None:
        import json

        step = _copy(source, scratch)
        info = json.loads((step / "parc.json").read_text())
        (step / "parc.json").write_text(json.dumps(change(info)))

    return damage


def _outside(source: Path, scratch: Path) -> None:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    step = _copy(source, scratch)
    index = FileSystemReader(str(step)).read_metadata()  # our own file: safe to unpickle here
    for key, item in index.storage_data.items():
        index.storage_data[key] = type(item)(relative_path="../../secret", offset=item.offset, length=item.length,
                                             transform_descriptors=None)
    (step / ".metadata").write_bytes(pickle.dumps(index))


def _files(source: Path, scratch: Path) -> None:
    (scratch / "file").write_text("precious")
    (scratch / "dangling").symlink_to(scratch / "gone")


def _tokens(source: Path, scratch: Path) -> None:
    good = b"\x01\x00" * 100
    (scratch / "folder").mkdir()
    (scratch / "empty").write_bytes(b"")
    (scratch / "odd.bin").write_bytes(good + b"\x01")
    (scratch / "big_ids.bin").write_bytes(good + b"\xfa\x00")


def _truncated(source: Path, scratch: Path) -> None:
    data = _copy(source, scratch) / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:1000])


DAMAGES = {
    "files": _files,
    "tokens": _tokens,
    "leading-out": lambda source, scratch: ((scratch / "ck").mkdir(), (scratch / "ck" / "step_000009").symlink_to(source)),
    "json-list": _json(lambda info: [info]),
    "json-step": _json(lambda info: dict(info, optimizer_step=-1)),
    "json-layers": _json(lambda info: dict(info, model=dict(info["model"], layers="2"))),
    "pickle": lambda source, scratch: (_copy(source, scratch) / ".metadata").write_bytes(
        pickle.dumps(Payload(scratch / "SENTINEL"))),
    "outside": _outside,
    "truncated": _truncated,
}


def main() -> None:
    build = Path(sys.argv[1]).resolve()
    options = {arg.split("=", 1)[0]: arg.split("=", 1)[1] for arg in sys.argv[2:] if arg.startswith(("--damage=", "--source="))}
    flags = [arg for arg in sys.argv[2:] if not arg.startswith(("--damage=", "--source="))]
    scratch = build / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    if "--damage" in options:
        DAMAGES[options["--damage"]](Path(options.get("--source", "")), scratch)
    sys.stdout.reconfigure(line_buffering=True)
    sys.path.insert(0, str(build))
    sys.argv = [str(build / "train.py"), *flags]
    runpy.run_path(str(build / "train.py"), run_name="__main__")


main()
