"""Run a Python script as ``__main__`` and, when it exits, write this process's peak
resident memory to ``DIR/rss-rank{RANK}.txt`` (bytes; ``RANK`` from torchrun).

bench/peer.py starts both sides' ranks through it (``torchrun bench/peer_rss.py DIR
script args...``), so their memory per rank is measured the same way: CPU tensors have
no allocator statistics, and the peak RSS holds parameters, gradients, optimizer state
and activations alike (and the interpreter and torch themselves, the same on both).

    python bench/peer_rss.py DIR SCRIPT [ARGS...]
"""

from __future__ import annotations

import atexit
import os
import resource
import runpy
import sys
from pathlib import Path


def _write(directory: Path) -> None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"rss-rank{os.environ.get('RANK', '0')}.txt").write_text(str(peak))


def main() -> None:
    directory, script = Path(sys.argv[1]), sys.argv[2]
    sys.argv = [script, *sys.argv[3:]]
    sys.path[0] = str(Path(script).resolve().parent)
    atexit.register(_write, directory)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
