"""``parc explain``: a spec's pipeline schedule as text and as a Gantt chart.

Takes: argv (SPEC, --set, -o DIR). Gives: on stdout the layout, the schedule, its bubble
fraction (forward = 1, backward = 2 time units per chunk, communication free), each
rank's bound on micro-batches in flight, each rank's timeline as text and its action
list; and ``DIR/schedule.svg`` (default: the current folder), the only file it writes.
Exit status: 0 done, 1 spec errors (or a layout left ``auto``), 2 usage error.
Before: ``parc.dsl.load``. After: nothing; the lists come from ``runtime/schedule.py``,
the very ones the pipeline executor runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from parc.dsl.diagnostics import Diagnostics
from parc.dsl.spec import Spec
from parc.runtime.paths import UnwritablePath, check_target
from parc.runtime.schedule import Action, build_schedule, in_flight_bound
from parc.runtime.schedule_sim import Timeline, bubble_fraction, describe_rank, simulate

from .. import gantt
from ..errors import AUTO, BAD_VALUE, error, fail

SVG_NAME = "schedule.svg"
FORWARD_TIME, BACKWARD_TIME = 1.0, 2.0


def register(subparsers) -> None:
    from parc.dsl.commands import add_set_argument

    parser = subparsers.add_parser(
        "explain",
        help="show a spec's pipeline schedule: timeline, bubble, schedule.svg",
        description="Print each pipeline rank's timeline and actions for SPEC, its bubble "
        f"fraction and in-flight bounds, and write {SVG_NAME} (a Gantt chart) into DIR.",
    )
    parser.add_argument("spec", metavar="SPEC")
    add_set_argument(parser)
    parser.add_argument("-o", "--output", metavar="DIR", default=None,
                        help=f"folder for {SVG_NAME} (default: the current folder)")
    parser.set_defaults(func=run_explain)


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    spec: Spec
    kind: str  # "gpipe" | "1f1b" | "interleaved"
    stages: int
    micro_batches: int
    chunks: int
    schedule: tuple[tuple[Action, ...], ...]
    timeline: Timeline
    bubble: float
    in_flight: tuple[int, ...]  # per rank, in_flight_bound

    @property
    def schedule_text(self) -> str:
        return f"interleaved(chunks = {self.chunks})" if self.chunks > 1 else self.kind

    @property
    def layout_text(self) -> str:
        par = self.spec.parallel
        tp = "auto" if par.tp is None else par.tp
        parts = [f"dp {par.dp} × tp {tp} × pp {par.pp}"]
        if par.sp:
            parts.append("sp")
        if par.zero:
            parts.append(f"zero {par.zero}")
        return ", ".join(parts)


def explain(spec: Spec) -> Explanation:
    """The schedule of ``spec`` and its simulation; ``Diagnostics`` if the layout is not given."""
    par, train = spec.parallel, spec.train
    missing = [key for key, value in (("parallel.dp", par.dp), ("parallel.pp", par.pp),
                                      ("parallel.schedule", par.schedule),
                                      ("train.micro_batch", train.micro_batch)) if value is None]
    if missing:
        world = spec.mesh.nodes * spec.mesh.devices_per_node
        names = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + missing[-1]
        if missing == ["train.micro_batch"]:
            example = f"--set train.micro_batch=1 (micro_batch·dp must divide global_batch = {train.global_batch})"
        else:
            example = f"--set parallel.pp=2 (dp·cp·tp·pp must equal nodes·devices_per_node = {world})"
        fail([error(spec, missing[0], AUTO,
                    f"parc explain needs the layout given, but {names} {'is' if len(missing) == 1 else 'are'} auto",
                    f"set {'it' if len(missing) == 1 else 'them'} on the command line, e.g. {example}")])
    stages, chunks = par.pp, par.chunks
    micro_batches = train.global_batch // (train.micro_batch * par.dp)
    kind = par.schedule.value
    try:
        schedule = build_schedule(kind, stages=stages, micro_batches=micro_batches, chunks=chunks)
        bounds = tuple(in_flight_bound(kind, stages=stages, rank=rank, micro_batches=micro_batches,
                                       chunks=chunks) for rank in range(stages))
    except ValueError as exc:  # the front end rejects these sizes; a Spec built by hand may not
        fail([error(spec, "parallel.schedule", BAD_VALUE, f"cannot schedule this pipeline: {exc}")])
    timeline = simulate(schedule, forward_time=FORWARD_TIME, backward_time=BACKWARD_TIME)
    return Explanation(spec=spec, kind=kind, stages=stages, micro_batches=micro_batches, chunks=chunks,
                       schedule=schedule, timeline=timeline, bubble=bubble_fraction(timeline),
                       in_flight=bounds)


def text(ex: Explanation) -> str:
    """What ``parc explain`` prints."""
    par, train = ex.spec.parallel, ex.spec.train
    unit = "micro-batch-chunks" if ex.chunks > 1 else "micro-batches"
    idle = ex.bubble * ex.stages * ex.timeline.makespan
    lines = [
        f"parc explain {ex.spec.source}",
        f"  layout         {ex.layout_text} ({ex.spec.mesh.nodes * ex.spec.mesh.devices_per_node} ranks)",
        f"  schedule       {ex.schedule_text} over {ex.stages} pipeline stage{'s' if ex.stages > 1 else ''}"
        + (f" ({ex.stages * ex.chunks} virtual stages)" if ex.chunks > 1 else ""),
        f"  micro-batches  {ex.micro_batches} per step = global_batch {train.global_batch} / "
        f"(micro_batch {train.micro_batch} · dp {par.dp})",
        f"  chunks         {ex.chunks} per rank",
        f"  bubble         {ex.bubble:.1%}: {gantt.number(idle)} of {ex.stages} × {gantt.number(ex.timeline.makespan)} "
        f"time units idle (forward = 1, backward = 2 per chunk, communication free)",
        "  in flight      at most " + ", ".join(f"rank {r}: {n}" for r, n in enumerate(ex.in_flight))
        + f" {unit} (forward done, backward not yet)",
        "",
        "timeline (one column per forward time unit; F forward, B backward, . idle"
        + ("; F3.1 = micro-batch 3, chunk 1)" if ex.chunks > 1 else ")"),
        *timeline_rows(ex.timeline, ex.chunks),
        "",
        "actions (ra/sa: receive/send activation, rg/sg: receive/send gradient; <r from rank r, >r to rank r)",
        *(f"rank {rank} | {describe_rank(actions, ex.chunks)}" for rank, actions in enumerate(ex.schedule)),
    ]
    return "\n".join(lines) + "\n"


def timeline_rows(timeline: Timeline, chunks: int) -> list[str]:
    """A ruler and one line per rank; time quantized to the forward unit."""
    names = [[gantt.label(e.op, e.micro, e.chunk, chunks) for e in events] for events in timeline.ranks]
    width = max((len(n) for row in names for n in row), default=2)
    units = round(timeline.makespan / FORWARD_TIME)
    prefix = f"rank {len(timeline.ranks) - 1} | "
    ruler = [" "] * (units * (width + 1))
    for t in range(0, units, 5):
        ruler[t * (width + 1):t * (width + 1) + len(str(t))] = str(t)
    rows = [" " * len(prefix) + "".join(ruler).rstrip()]
    for rank, events in enumerate(timeline.ranks):
        cells, now = [], 0
        for event, name in zip(events, names[rank]):
            start, end = round(event.start / FORWARD_TIME), round(event.end / FORWARD_TIME)
            cells += [".".ljust(width)] * (start - now)
            cells.append(name.ljust((end - start) * (width + 1) - 1, "-" if end - start > 1 else " "))
            now = end
        cells += [".".ljust(width)] * (units - now)
        rows.append(f"rank {rank} | ".rjust(len(prefix)) + " ".join(cells).rstrip())
    return rows


def chart(ex: Explanation) -> str:
    title = f"{ex.spec.source}: {ex.schedule_text}, {ex.micro_batches} micro-batches, bubble {ex.bubble:.1%}"
    subtitle = (f"{ex.spec.model.name}: {ex.layout_text}; {ex.stages} pipeline rank"
                f"{'s' if ex.stages > 1 else ''}, {ex.chunks} chunk{'s' if ex.chunks > 1 else ''} each")
    return gantt.svg(ex.timeline, chunks=ex.chunks, title=title, subtitle=subtitle,
                     time_label="time (forward = 1, backward = 2 per chunk; communication not counted)")


def run_explain(args: argparse.Namespace) -> int:
    from parc.dsl.commands import load_or_report

    from .build import report_stage_errors

    spec = load_or_report(args.spec, args.overrides)
    if spec is None:
        return 1
    try:
        ex = explain(spec)
    except Diagnostics as exc:
        return report_stage_errors(exc, args.spec, args.overrides)
    out_dir = Path(args.output) if args.output else Path(".")
    target = out_dir / SVG_NAME
    try:
        check_target(out_dir, folder=True)  # a file, /dev/null, a symlink to nothing, read-only
        check_target(target, folder=False)
    except UnwritablePath as exc:
        print(f"parc explain: {exc}", file=sys.stderr)
        return 1
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / f".{SVG_NAME}.parc-tmp"
        tmp.write_bytes(chart(ex).encode("utf-8"))
        os.replace(tmp, target)
    except OSError as exc:
        print(f"parc explain: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    sys.stdout.write(text(ex))
    print(f"\nwrote {target}")
    return 0
