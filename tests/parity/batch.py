"""Build many (spec, layout) cases and run their trainers, those of one world size in one launch.

Takes: ``Case``s (a spec of ``specs/``, its ``--set`` overrides, the trainer's flags,
the ranks it needs). Gives: ``Batches``, whose ``run(case)`` is the case's build
folder and JSONL records; the first case asked for runs every wanted case of its
world size, in one ``torchrun`` launch of ``batch_worker.py`` (Note [one launch,
many trainers] there). tests/conftest.py makes one ``Batches`` for each unit of tests
from what each test module's ``cases_of(item)`` says its selected tests read; the
units of one process share their results.
Each case keeps its own result: a build that fails, a trainer that fails or stalls
is that case's failure, with its own logs, and the cases after it are launched again
without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from parc.codegen.build import build_to

from .harness import SPECS, TORCHRUN, free_port

WORKER = Path(__file__).with_name("batch_worker.py")
STALL_TIMEOUT = 300.0
"""Seconds a launch may go without finishing a run before it counts as hung."""
LOG_TAIL = 8000


@dataclass(frozen=True)
class Case:
    name: str
    """Unique, and a valid folder name: the test's words for it (``gpt-tp2-sp``)."""
    spec: str
    overrides: tuple[str, ...]
    nproc: int
    args: tuple[str, ...] = ()
    """Trainer flags besides ``--metrics-jsonl`` (which each case gets in its build folder).
    ``{build}`` in one stands for this case's build folder, ``{build:NAME}`` for case NAME's
    (one of an earlier phase: its checkpoints, say)."""
    phase: int = 0
    """Cases run in phases: every wanted case of a phase before any of the next (a resume
    reads what an earlier phase's run saved, whatever its world size)."""
    env: tuple[tuple[str, str | None], ...] = ()
    """Environment variables set for this run alone (a test's fault injection, say); None
    unsets one (the tests' ``PARC_KERNELS_EAGER_BELOW``, for a run that takes a user's defaults)."""
    script: str | None = None
    """Run this script with the build folder as its first argument instead of the build's
    ``train.py`` (tests/checkpoint/reshard_worker.py wraps a trainer)."""
    exit_status: int = 0
    """What the trainer must exit with: 1 for a run it refuses (tests/checkpoint/test_bad_files.py);
    any other status is the case's failure."""


@dataclass(frozen=True)
class Result:
    build: Path | None
    records: list | None
    failure: str = ""
    log: Path | None = None
    """Rank 0's stdout and stderr of the run."""


class Batches:
    """The runs of ``wanted`` cases, made on first use, one launch per world size."""

    def __init__(self, tmp_path_factory, wanted: list[Case], results: dict | None = None):
        self.tmp_path_factory = tmp_path_factory
        self.wanted = list({case.name: case for case in wanted}.values())
        self.results: dict[str, Result] = {} if results is None else results
        """By case name; shared by the ``Batches`` of one process (a case already run is not run again)."""

    def run(self, case: Case) -> Result:
        """The case's build and records; a failed case raises ``AssertionError`` with its logs."""
        if case.name not in self.results:
            for phase in range(case.phase):
                for nproc in sorted({c.nproc for c in self.wanted if c.phase == phase}):
                    earlier = [c for c in self.wanted if (c.phase, c.nproc) == (phase, nproc)]
                    if any(c.name not in self.results for c in earlier):
                        self.run(next(c for c in earlier if c.name not in self.results))
            batch = [c for c in self.wanted
                     if (c.nproc, c.phase) == (case.nproc, case.phase) and c.name not in self.results]
            batch += [] if case in batch else [case]
            self.results.update(self._run(batch))
        result = self.results[case.name]
        if result.records is None:
            raise AssertionError(result.failure)
        return result

    def records(self, case: Case) -> list[dict]:
        return self.run(case).records

    def _run(self, cases: list[Case]) -> dict[str, Result]:
        results, built, first = {}, [], {}
        for case in cases:
            out = self.tmp_path_factory.mktemp(case.name)
            source = (case.spec, case.overrides)
            try:
                if source in first:  # the same spec and overrides build the same folder: copy it
                    built.append((case, Path(shutil.copytree(first[source], out / first[source].name))))
                    continue
                built.append((case, Path(build_to(SPECS / case.spec, out, list(case.overrides)))))
                first[source] = built[-1][1]
            except Exception:  # noqa: BLE001 - this case's failure, not the batch's
                results[case.name] = Result(None, None, f"parc build failed for {case.name}:\n{traceback.format_exc()}")
        folders = {name: result.build for name, result in self.results.items()}
        folders.update((case.name, build_dir) for case, build_dir in built)
        launch = 0
        while built:
            folder = self.tmp_path_factory.mktemp(f"launch-{cases[0].nproc}ranks-{launch}")
            finished, failure = launch_batch(built, cases[0].nproc, folder, folders)
            for index, (case, build_dir) in enumerate(built[:finished]):
                metrics = build_dir / "metrics.jsonl"  # none when the trainer refused to start
                text = metrics.read_text() if metrics.exists() else ""
                rows = [json.loads(line) for line in text.splitlines() if line.strip()]
                results[case.name] = Result(build_dir, rows, log=folder / f"{index:02d}-{case.name}" / "rank0.log")
            if finished < len(built):
                case, build_dir = built[finished]
                results[case.name] = Result(build_dir, None, failure, folder / f"{finished:02d}-{case.name}" / "rank0.log")
            built, launch = built[finished + 1:], launch + 1
        return results


def launch_batch(built: list[tuple[Case, Path]], nproc: int, folder: Path, folders: dict[str, Path]) -> tuple[int, str]:
    """Run ``built`` in one launch; (how many finished, why the next one failed).
    ``folders``: every case's build folder by name, for the ``{build:NAME}`` in the flags."""
    runs = []
    for index, (case, build_dir) in enumerate(built):
        logs = folder / f"{index:02d}-{case.name}"
        logs.mkdir()
        (build_dir / "metrics.jsonl").unlink(missing_ok=True)
        args = ["--metrics-jsonl", str(build_dir / "metrics.jsonl"), *(_place(a, build_dir, folders) for a in case.args)]
        train = str(build_dir / "train.py")
        if case.script is not None:
            train, args = case.script, [str(build_dir), *args]
        runs.append({"train": train, "args": args, "logs": str(logs), "cwd": str(build_dir), "env": dict(case.env),
                     "exit_status": case.exit_status})
    plan = folder / "runs.json"
    plan.write_text(json.dumps({"runs": runs}, indent=1))
    command = [str(TORCHRUN), f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(WORKER), str(plan)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    with open(folder / "torchrun.out", "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        finished, stalled = _wait(process, runs, nproc)
    if finished == len(runs):
        return finished, ""
    case, build_dir = built[finished]
    why = f"stalled for {STALL_TIMEOUT:.0f} s" if stalled else f"torchrun exit {process.returncode}"
    return finished, _failure_text(case, build_dir, Path(runs[finished]["logs"]), folder / "torchrun.out", why)


def _place(arg: str, build_dir: Path, folders: dict[str, Path]) -> str:
    """``arg`` with ``{build}`` and ``{build:NAME}`` replaced by those folders."""
    if "{build" not in arg:
        return arg
    head, _, rest = arg.partition("{build")
    name, _, tail = rest.partition("}")
    folder = build_dir if not name else folders.get(name.removeprefix(":"))
    if folder is None:  # that case's build failed: the flag names what is missing
        return f"{head}<no build of {name.removeprefix(':')}>{tail}"
    return f"{head}{folder}{tail}"


def _done(run: dict, nproc: int) -> bool:
    return all(os.path.exists(os.path.join(run["logs"], f"rank{rank}.done")) for rank in range(nproc))


def _wait(process, runs: list[dict], nproc: int) -> tuple[int, bool]:
    """Wait for the launch; (runs finished, whether it stalled and was killed)."""
    finished, progress = 0, time.monotonic()
    while True:
        returned = process.poll() is not None
        while finished < len(runs) and _done(runs[finished], nproc):
            finished, progress = finished + 1, time.monotonic()
        if returned:
            return finished, False
        if time.monotonic() - progress > STALL_TIMEOUT:
            _stop(process)
            return finished, True
        time.sleep(0.2)


def _stop(process) -> None:
    """End a hung launch: SIGTERM lets torchrun stop its workers (their own sessions)."""
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _failure_text(case: Case, build_dir: Path, logs: Path, torchrun_out: Path, why: str) -> str:
    parts = [f"trainer failed ({why}) for {case.name}, build {build_dir}, in a batch launch:"]
    for log in sorted(logs.glob("rank*.log")):
        parts.append(f"--- {log.stem}\n{log.read_text(errors='replace')[-LOG_TAIL:]}")
    parts.append(f"--- torchrun\n{torchrun_out.read_text(errors='replace')[-LOG_TAIL:]}")
    return "\n".join(parts)
