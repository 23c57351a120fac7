"""``parc verify``'s work: build a shrunk layout and its one-rank reference, run both, compare.

Takes: a spec path and ``--set`` overrides (or, through ``codegen/verify_dir.py``, a
build folder). Gives: a ``Verdict`` — the layout, the shrink (``codegen/shrink.py``),
each step's loss and the first step's gradient norm from both programs, the worst
relative difference and the first record that differs by more than ``RTOL`` — and
``junit_xml(verdict)``. The programs run as a user runs them: ``torchrun`` of the
generated ``train.py`` on CPU gloo, ``--metrics-jsonl``, ``OMP_NUM_THREADS=1``, no GPU
(DESIGN §8's parity test, for the user's own layout). Before: ``codegen/shrink.py``.
After: ``codegen/cli/verify.py`` prints it.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from parc import dsl

from .build import generate
from .build_folder import write
from .lower import lower
from .render import layout_words
from .shrink import Shrink, shrink

RTOL = 1e-5
"""Relative difference allowed between a layout and one rank (fp32; DESIGN §8)."""
STEPS = 3
MAX_RANKS = 64
"""Ranks ``parc verify`` starts at most by default: each is a process on this machine."""


class VerifyError(Exception):
    """Verify could not get as far as a comparison (a trainer failed, a folder is unusable)."""

    def __init__(self, message: str, hint: str | None = None, detail: str = ""):
        super().__init__(message)
        self.hint = hint
        self.detail = detail


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One compared number: a step's loss, or the first step's gradient norm."""

    name: str
    step: int
    reference: float
    layout: float | None
    """None: the layout's trainer logged no such step."""

    @property
    def difference(self) -> float:
        if self.layout is None or not math.isfinite(self.layout):
            return math.inf
        return abs(self.layout - self.reference) / max(abs(self.reference), 1e-30)

    @property
    def ok(self) -> bool:
        return self.difference <= RTOL


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    layout: str
    world: int
    shrink: Shrink
    reference_overrides: tuple[str, ...]
    records: tuple[Record, ...]
    seconds: float
    notes: tuple[str, ...] = field(default=())
    command: str = ""
    """The ``parc build`` of the shrunk layout, to reproduce it by hand."""

    @property
    def passed(self) -> bool:
        return bool(self.records) and all(r.ok for r in self.records)

    @property
    def first_failure(self) -> Record | None:
        return next((r for r in self.records if not r.ok), None)

    @property
    def worst(self) -> Record | None:
        return max(self.records, key=lambda r: r.difference, default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """The shrunk layout and its reference, checked and lowered, ready to build."""

    shrink: Shrink
    layout_spec: object
    reference_spec: object
    layout_plan: object
    command: str


def prepare(spec_path: str, overrides: list[str], *, steps: int = STEPS, max_ranks: int = MAX_RANKS) -> Prepared:
    """Load the spec, shrink it, and load both shrunk specs through the front end (so every
    override is checked as if typed). ``Diagnostics`` for a bad spec; ``VerifyError`` when
    the layout has more ranks than ``max_ranks``."""
    spec = dsl.load(spec_path, overrides)
    found = shrink(spec, steps=steps)
    if found.world > max_ranks:
        raise VerifyError(
            f"the layout has {found.world} ranks; verify runs each as a process here (at most {max_ranks})",
            "verify a smaller layout of the same kind (--set parallel.dp=2), or raise --max-ranks",
        )
    layout_sets = [*overrides, *found.overrides]
    layout_spec = dsl.load(spec_path, layout_sets)
    reference_spec = dsl.load(spec_path, [*layout_sets, *found.reference])
    command = shlex.join(["parc", "build", spec_path, *(f"--set={item}" for item in layout_sets)])
    return Prepared(shrink=found, layout_spec=layout_spec, reference_spec=reference_spec,
                    layout_plan=lower(layout_spec), command=command)


def build_into(spec, folder: Path) -> Path:
    """Write the build of ``spec`` into ``folder`` (a fresh temporary one)."""
    write(folder, generate(spec))
    return folder


def run_trainer(folder: Path, nproc: int, *, steps: int, timeout: float) -> list[dict]:
    """Run ``folder/train.py`` on ``nproc`` CPU gloo ranks; the JSONL records of rank 0."""
    metrics = folder / "verify-metrics.jsonl"
    metrics.unlink(missing_ok=True)
    logs = folder / "verify-logs"
    shutil.rmtree(logs, ignore_errors=True)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "--log-dir", str(logs), "--tee", "2",  # each rank's stderr in a file too: rank_error
        "train.py", "--metrics-jsonl", str(metrics), "--steps", str(steps),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)  # the build's own parc_runtime, not an installed one
    try:
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise VerifyError(f"{folder / 'train.py'} on {nproc} rank(s) did not finish in {timeout:g} s",
                          "raise --timeout") from None
    if done.returncode != 0:
        rank, text = rank_error(logs, done.stderr or "")
        tail = "\n".join((text or done.stderr or done.stdout).strip().splitlines()[-TAIL_LINES:])
        which = f"rank {rank} of {nproc}" if rank is not None else f"{nproc} rank(s)"
        raise VerifyError(f"{folder / 'train.py'} on {which} failed (exit {done.returncode})", None, tail)
    if not metrics.is_file():
        return []
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


TAIL_LINES = 30


def rank_error(logs: Path, summary: str) -> tuple[int | None, str]:
    """The failing rank and its own stderr (its exception), not torchrun's summary of the
    ranks: the rank the summary names as the root cause, else the first whose stderr
    holds a traceback or an error. (None, "") when no rank's log says anything."""
    files = {}
    for path in sorted(logs.glob("**/attempt_*/*/stderr.log")):
        if path.parent.name.isdigit():
            files.setdefault(int(path.parent.name), path)
    texts = {rank: path.read_text(encoding="utf-8", errors="replace") for rank, path in sorted(files.items())}
    cause = re.search(r"Root Cause.*?rank\s*:\s*(\d+)", summary, flags=re.S)
    named = int(cause.group(1)) if cause else None
    if named is not None and texts.get(named, "").strip():
        return named, texts[named]
    for rank, text in texts.items():
        if "Traceback" in text or "error" in text.lower():
            return rank, text
    return None, ""


def compare(reference: list[dict], layout: list[dict], steps: int) -> tuple[Record, ...]:
    """Every step's loss and the first step's gradient norm, one rank against the layout."""
    want = {r["step"]: r for r in reference}
    got = {r["step"]: r for r in layout}
    missing = [s for s in range(1, steps + 1) if s not in want]
    if missing:
        raise VerifyError(f"the one-rank reference logged no step {missing[0]}")
    records = []
    for step in range(1, steps + 1):
        records.append(Record(name="loss", step=step, reference=float(want[step]["loss"]),
                              layout=_number(got.get(step), "loss")))
        if step == 1:
            records.append(Record(name="grad_norm", step=1, reference=float(want[1]["grad_norm"]),
                                  layout=_number(got.get(1), "grad_norm")))
    return tuple(records)


def _number(record: dict | None, key: str) -> float | None:
    if record is None or not isinstance(record.get(key), (int, float)):
        return None
    return float(record[key])


def run_pair(layout_folder: Path, reference_folder: Path, *, world: int, steps: int, timeout: float):
    """Run the reference and the layout; (reference records, layout records)."""
    reference = run_trainer(reference_folder, 1, steps=steps, timeout=timeout)
    layout = run_trainer(layout_folder, world, steps=steps, timeout=timeout)
    return reference, layout


def verify_spec(spec_path: str, overrides: list[str], workdir: Path, *, steps: int = STEPS,
                timeout: float = 600, max_ranks: int = MAX_RANKS) -> Verdict:
    """``parc verify SPEC``: shrink, build both programs under ``workdir``, run, compare."""
    start = time.perf_counter()
    prepared = prepare(spec_path, overrides, steps=steps, max_ranks=max_ranks)
    layout_folder = build_into(prepared.layout_spec, workdir / "layout")
    reference_folder = build_into(prepared.reference_spec, workdir / "one-rank")
    reference, layout = run_pair(layout_folder, reference_folder, world=prepared.shrink.world, steps=steps,
                                 timeout=timeout)
    return Verdict(
        layout=describe(prepared.layout_plan), world=prepared.shrink.world, shrink=prepared.shrink,
        reference_overrides=prepared.shrink.reference, records=compare(reference, layout, steps),
        seconds=time.perf_counter() - start, command=prepared.command,
    )


def describe(plan) -> str:
    """The layout in words: degrees, sp, ZeRO, schedule, recompute, overlap."""
    words = layout_words(plan)
    pipeline = plan.pipeline
    if plan.mesh.size("pp") > 1:
        chunks = f"(chunks = {pipeline.chunks})" if pipeline.chunks > 1 else ""
        words += f", schedule {pipeline.schedule}{chunks}"
    for entry in plan.used_settings():
        used = sorted({value for value in plan.per_block(entry.name) if value != entry.off}, key=str)
        words += f", {entry.name} {'/'.join(entry.word(value) for value in used)}"
    return words


# ---- JUnit ------------------------------------------------------------------------------


def junit_xml(verdict: Verdict, name: str) -> bytes:
    """A JUnit XML report: one testcase per compared record (CI systems read it)."""
    failures = sum(not r.ok for r in verdict.records)
    suite = ET.Element("testsuite", name=f"parc verify {name}", tests=str(len(verdict.records)),
                       failures=str(failures), errors="0", time=f"{verdict.seconds:.3f}")
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="layout", value=verdict.layout)
    for change in verdict.shrink.changes:
        ET.SubElement(properties, "property", name=f"shrink {change.key}", value=f"{change.before} -> {change.after}")
    for record in verdict.records:
        case = ET.SubElement(suite, "testcase", classname=f"parc.verify.{_class_name(name)}",
                             name=f"step {record.step} {record.name}", time="0")
        if not record.ok:
            failure = ET.SubElement(case, "failure", message=failure_text(record), type="ParityFailure")
            failure.text = failure_text(record)
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n"


def junit_error(name: str, message: str, detail: str = "") -> bytes:
    """The JUnit XML of a verify that stopped before comparing: one test case, in error."""
    suite = ET.Element("testsuite", name=f"parc verify {name}", tests="1", failures="0", errors="1", time="0")
    case = ET.SubElement(suite, "testcase", classname=f"parc.verify.{_class_name(name)}", name="verify")
    error = ET.SubElement(case, "error", message=message, type="VerifyError")
    error.text = detail or message
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n"


def _class_name(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in Path(name).name) or "spec"


def failure_text(record: Record) -> str:
    what = f"step {record.step}: {record.name}"
    if record.layout is None:
        return f"{what}: the layout logged no value (one rank: {record.reference!r})"
    return (f"{what} differs: layout {record.layout!r}, one rank {record.reference!r} "
            f"(relative difference {record.difference:.3g} > {RTOL:g})")
