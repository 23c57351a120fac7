"""Build a spec in some layout, run the generated trainer with torchrun, read its metrics.

The parity suite (DESIGN §8) compares every layout's per-step losses with the
single-rank build of the same spec. Everything here goes through the public
surfaces a user has: ``parc build`` (via ``build_to``), ``torchrun``, and the
trainer's ``--metrics-jsonl`` output.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from parc.codegen.build import build_to

SPECS = Path(__file__).parent / "specs"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def layout_overrides(*, dp: int = 1, tp: int = 1, pp: int = 1, sp: bool = False, cp: int = 1, **extra) -> list[str]:
    """``--set`` arguments that put the spec on dp·cp·tp·pp CPU devices of one node
    (``cp_kind`` comes with the extras: ``parallel__cp_kind="ulysses"``)."""
    world = dp * cp * tp * pp
    sets = [
        f"parallel.dp={dp}",
        f"parallel.tp={tp}",
        f"parallel.pp={pp}",
        f"parallel.sp={'true' if sp else 'false'}",
        f"mesh.devices_per_node={world}",
    ]
    sets += [f"parallel.cp={cp}"] if cp > 1 else []
    sets += [f"{key.replace('__', '.')}={value}" for key, value in extra.items()]
    return sets


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_trainer(build_dir: Path, nproc: int, *, steps: int | None = None, timeout: float = 300) -> list[dict]:
    """Run ``build_dir/train.py`` on ``nproc`` gloo ranks; return the JSONL records."""
    metrics = build_dir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    command = [
        str(TORCHRUN),
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        str(build_dir / "train.py"),
        "--metrics-jsonl",
        str(metrics),
    ]
    if steps is not None:
        command += ["--steps", str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(
            f"trainer failed (exit {done.returncode}) for {build_dir}:\n"
            f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-8000:]}"
        )
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def build_and_run(spec: str, out_dir: Path, *, nproc: int, overrides: list[str], steps: int | None = None) -> list[dict]:
    build_dir = build_to(SPECS / spec, out_dir, overrides)
    return run_trainer(Path(build_dir), nproc, steps=steps)
