"""Start N ranks of a script on this machine (gloo on 127.0.0.1), as torchrun would.

``launch(script, world, args, out_dir)`` sets RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT for each process (no torchrun agent: one process start
less per rank), hides any GPU so the runtime picks gloo, waits, and on a failure or
a timeout stops the ranks it started and raises with their output.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(script: Path, world: int, args: list[str], out_dir: Path, *, timeout: float = 300) -> None:
    port = free_port()
    procs, logs = [], []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
            OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONHASHSEED="0",
        )
        log = open(out_dir / f"rank{rank}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=env, stdout=log,
                                      stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    failed = None
    while any(p.poll() is None for p in procs) and failed is None:
        if time.monotonic() > deadline:
            failed = f"timed out after {timeout:.0f} s"
        elif any(p.poll() not in (None, 0) for p in procs):
            failed = "a rank failed"
        else:
            time.sleep(0.1)
    if failed is None and any(p.returncode != 0 for p in procs):
        failed = "a rank failed"
    for p in procs:  # only the processes started above
        if p.poll() is None:
            p.kill()
            p.wait()
    for log in logs:
        log.close()
    if failed:
        output = "\n".join(
            f"--- rank {r} (exit {p.returncode})\n{(out_dir / f'rank{r}.log').read_text()[-4000:]}"
            for r, p in enumerate(procs)
        )
        raise AssertionError(f"{script.name} on {world} ranks: {failed}\n{output}")
