"""Run a generated train.py, saving a checkpoint right after it resumes (test helper).

    torchrun ... reshard_worker.py BUILD_DIR [train.py flags]

The trainer runs as is (its own layout, flags and loop); the only change is that
``Checkpoints.restore`` is followed by a save of the step it restored into
``--checkpoint-dir``, so a test can compare what a layout loaded with what another
saved, tensor by tensor.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

build_dir = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(build_dir))
from parc_runtime.checkpoints import checkpoint  # noqa: E402

_restore = checkpoint.Checkpoints.restore


def restore_and_save(self, resume, *, restarted=False):
    step = _restore(self, resume, restarted=restarted)
    self.save(step)
    return step


checkpoint.Checkpoints.restore = restore_and_save
sys.argv = [str(build_dir / "train.py"), *sys.argv[2:]]
runpy.run_path(str(build_dir / "train.py"), run_name="__main__")
