"""``parc explain``: a spec's pipeline schedule as text and as a Gantt chart.

Takes: argv (SPEC, --set, -o DIR). Gives: on stdout the layout, the schedule, its bubble
fraction (forward = 1, backward = 2 time units per chunk, communication free), each
rank's bound on micro-batches in flight, each rank's timeline as text and its action
list; and ``DIR/schedule.svg`` (default: the current folder), the only file it writes.
It replaces a ``schedule.svg`` it wrote before, never one of anybody else's.
A layout left ``auto`` is explained as the planner's winner (the one ``parc build``
generates). Exit status: 0 done, 1 spec errors (or no layout for the ``auto`` values),
2 usage error.
Before: ``parc.dsl.load``. After: nothing; the lists come from ``runtime/schedules/schedule.py``,
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
from parc.runtime.schedules.schedule import SLICED, Action, build_schedule, chunks_for, in_flight_bound
from parc.runtime.schedules.schedule_sim import Event, Timeline, bubble_fraction, describe_rank, simulate, splits_backward
from parc.runtime.schedules.schedule_terapipe import slice_scale, split_unit

from .. import gantt, layout_words
from ..passes.split_pipeline import stage_costs
from ..planner.cost.bubble import PLACEMENTS, SHAPES
from ..errors import BAD_VALUE, error, fail

SVG_NAME = "schedule.svg"
FORWARD_TIME, BACKWARD_TIME = 1.0, 2.0
SPLIT_TIMES = " as B 1 + W 1"  # a split backward (schedule.py, Note [B and W]): simulate's default halves


def _ours(target: Path) -> bool:
    """Whether ``target`` may be replaced: it does not exist, or an earlier ``explain`` wrote it."""
    try:
        with open(target, "rb") as f:
            head = f.read(200).decode("utf-8", "replace")
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return head.splitlines()[1:2] == [gantt.MARK]


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
    kind: str  # "gpipe" | "1f1b" | "interleaved" | "zero_bubble"
    stages: int
    micro_batches: int
    chunks: int
    schedule: tuple[tuple[Action, ...], ...]
    timeline: Timeline
    bubble: float
    in_flight: tuple[int, ...]  # per rank, in_flight_bound
    planned: bool = False  # the spec left the layout (some of it) auto: the planner's winner
    slices: int = 1  # a sliced schedule's token slices per micro-batch; the timeline's events are then (micro, slice)

    @property
    def parts(self) -> int:
        """What the chart shades and numbers after the micro-batch: slices, else chunks."""
        return self.slices if self.slices > 1 else self.chunks

    @property
    def part(self) -> str:
        return "slice" if self.slices > 1 else "chunk"

    @property
    def split(self) -> bool:
        """Backward as B then W (schedule.py, Note [B and W])."""
        return splits_backward(self.schedule)

    @property
    def schedule_text(self) -> str:
        if self.slices > 1:
            lengths = self.spec.parallel.slice_lengths
            return f"{self.kind}(slices = {list(lengths) if lengths else self.slices})"
        return f"interleaved(chunks = {self.chunks})" if self.kind == "interleaved" else self.kind

    @property
    def layout_text(self) -> str:
        """The layout in words, as train.py's docstring says it (codegen/layout_words.py)."""
        from ..planner.search import fixed_layout

        return layout_words.words(layout_words.of_layout(fixed_layout(self.spec)))


def explain(spec: Spec) -> Explanation:
    """The schedule of ``spec`` and its simulation; a layout left ``auto`` is the
    planner's winner, as ``parc build`` would generate it (``Diagnostics`` when the
    planner finds none)."""
    planned = not spec.layout_complete
    if planned:
        from ..passes import choose_layout
        from ..passes.draft import Draft

        spec = choose_layout.run(spec, Draft()).spec
    par, train = spec.parallel, spec.train
    kind = par.schedule.value
    stages, chunks = par.pp, chunks_for(kind, par.chunks)
    micro_batches = train.global_batch // (train.micro_batch * par.dp)
    slices = par.slices if kind in SLICED else 1
    try:
        costs = stage_costs(spec, kind) if stages > 1 else None  # the order train.py runs (STAGE_COSTS)
        schedule = build_schedule(kind, stages=stages, micro_batches=micro_batches, chunks=chunks, slices=slices,
                                  costs=costs)
        bounds = tuple(in_flight_bound(kind, stages=stages, rank=rank, micro_batches=micro_batches,
                                       chunks=chunks, slices=slices) for rank in range(stages))
    except ValueError as exc:  # the front end rejects these sizes; a Spec built by hand may not
        fail([error(spec, "parallel.schedule", BAD_VALUE, f"cannot schedule this pipeline: {exc}")])
    lengths = par.slice_lengths if slices > 1 else None  # uneven slices: each drawn as long as its tokens
    timeline = simulate(schedule, forward_time=FORWARD_TIME, backward_time=BACKWARD_TIME,
                        slice_scale=slice_scale(lengths) if lengths else ())
    bubble = bubble_fraction(timeline)
    if slices > 1:  # each event as (micro-batch, slice) of its unit (schedule_terapipe, Note [slices as units])
        timeline = Timeline(tuple(tuple(Event(e.op, *split_unit(e.micro, slices), e.start, e.end) for e in events)
                                  for events in timeline.ranks), timeline.makespan)
    return Explanation(spec=spec, kind=kind, stages=stages, micro_batches=micro_batches, chunks=chunks,
                       schedule=schedule, timeline=timeline, bubble=bubble,
                       in_flight=bounds, planned=planned, slices=slices)


def _placement_text(ex: Explanation) -> str:
    """Where each chunk sits when it is not Megatron's c·p + r (runtime/layout/placement.py)."""
    placement = getattr(ex.schedule, "placement", None)
    return "" if placement is None else PLACEMENTS.get(placement.kind, "")


def text(ex: Explanation) -> str:
    """What ``parc explain`` prints."""
    par, train = ex.spec.parallel, ex.spec.train
    unit = "slice" if ex.slices > 1 else "micro-batch-chunk" if ex.chunks > 1 else "micro-batch"
    idle = ex.bubble * ex.stages * ex.timeline.makespan
    planned = f"  planner        chose the auto values, as parc build would (parc plan {ex.spec.source} ranks them)"
    lines = [
        f"parc explain {ex.spec.source}",
        f"  layout         {ex.layout_text} ({ex.spec.mesh.nodes * ex.spec.mesh.devices_per_node} ranks)",
        *([planned] if ex.planned else []),
        f"  schedule       {ex.schedule_text} over {ex.stages} pipeline stage{'s' if ex.stages > 1 else ''}"
        + (SHAPES[ex.kind] if ex.kind in SHAPES
           else f" ({ex.stages * ex.chunks} virtual stages)" if ex.chunks > 1 else ""),
        f"  micro-batches  {ex.micro_batches} per step = global_batch {train.global_batch} / "
        f"(micro_batch {train.micro_batch} · dp {par.dp})",
        f"  chunks         {ex.chunks} per rank" + _placement_text(ex),
        f"  bubble         {ex.bubble:.1%}: {gantt.number(idle)} of {ex.stages} × {gantt.number(ex.timeline.makespan)} "
        f"time units idle (forward = 1, backward = 2 per {ex.part}{SPLIT_TIMES if ex.split else ''}"
        + (", a slice's times scaled by its tokens over the mean slice's" if par.slice_lengths and ex.slices > 1
           else "") + ", "
        "communication free)",
        "  in flight      at most " + ", ".join(f"rank {r}: {n}" for r, n in enumerate(ex.in_flight))
        + f" {plural(max(ex.in_flight), unit)} (forward done, {'W' if ex.split else 'backward'} not yet)",
        "",
        *timeline_section(ex),
        "",
        "actions (ra/sa: receive/send activation, rg/sg: receive/send gradient; <r from rank r, >r to rank r"
        + ("; B input gradient, W weight gradient)" if ex.split
           else f"; F5 = unit 5 = micro-batch 5 // {ex.slices}, slice 5 % {ex.slices})" if ex.slices > 1 else ")"),
        *(line for rank, actions in enumerate(ex.schedule)
          for line in wrapped(f"rank {rank} | ", describe_rank(actions, ex.chunks))),
    ]
    return "\n".join(lines) + "\n"


WIDTH = 100
"""Columns ``parc explain`` prints at most: wider timelines are summarized, action
lists wrapped (256 micro-batches would make lines thousands of characters wide)."""


def plural(count: int, word: str) -> str:
    return word if count == 1 else f"{word}es" if word.endswith("batch") else f"{word}s"


ACTIONS_SHOWN = 48
"""A rank's action list longer than this shows its first and last actions (each
rank's is the same pattern throughout: warm-up, steady state, cool-down)."""


def wrapped(prefix: str, text: str) -> list[str]:
    """``prefix + text`` in lines of at most ``WIDTH`` columns, continued under the text;
    past ``ACTIONS_SHOWN`` words, the first and last of them around how many are left out."""
    import textwrap

    words = text.split()
    if len(words) > ACTIONS_SHOWN:
        head, tail = ACTIONS_SHOWN * 2 // 3, ACTIONS_SHOWN // 3
        text = " ".join([*words[:head], f"… {len(words) - head - tail} more …", *words[-tail:]])
    return textwrap.wrap(text, WIDTH, initial_indent=prefix, subsequent_indent=" " * (len(prefix) - 2) + "| ",
                         break_on_hyphens=False, break_long_words=False) or [prefix.rstrip()]


BANDS = 4
"""A timeline up to this many times ``WIDTH`` is drawn in bands, one under the other;
a longer one is summarized (its drawing is in schedule.svg)."""


def timeline_section(ex: Explanation) -> list[str]:
    """The timeline drawn one column per time unit, in bands of at most ``WIDTH``
    columns; when that takes more than ``BANDS`` bands, each rank's busy and idle time."""
    prefix, cell, rows = timeline_rows(ex.timeline, ex.parts)
    per_band = max(5, (WIDTH - prefix) // cell // 5 * 5)  # time units a band shows: the ruler's 5s stay whole
    units = round(ex.timeline.makespan / FORWARD_TIME)
    bands = -(-units // per_band)
    if bands <= BANDS:
        out = ["timeline (one column per forward time unit; F forward, B backward, "
               + ("W weight gradient, " if ex.split else "") + ". idle"
               + (f"; F3.1 = micro-batch 3, {ex.part} 1)" if ex.parts > 1 else ")")]
        for band in range(bands):
            start, stop = prefix + band * per_band * cell, prefix + (band + 1) * per_band * cell
            out += [""] if band else []
            out += [(row[:prefix] + row[start:stop]).rstrip() for row in rows]
        return out
    makespan = ex.timeline.makespan
    out = [f"timeline ({gantt.number(makespan)} time units, too wide to draw here: see {SVG_NAME})"]
    for rank, events in enumerate(ex.timeline.ranks):
        busy = sum(e.end - e.start for e in events)
        first = events[0].start if events else makespan
        last = events[-1].end if events else makespan
        out.append(f"rank {rank} | busy {gantt.number(busy)}, idle {gantt.number(makespan - busy)}: "
                   f"{gantt.number(first)} before its first action, {gantt.number(makespan - last)} after its last")
    return out


def timeline_rows(timeline: Timeline, chunks: int) -> tuple[int, int, list[str]]:
    """A ruler and one line per rank, time quantized to the forward unit; with the
    width of the rows' ``rank r | `` prefix and of one time unit's cell."""
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
    return len(prefix), width + 1, rows


def chart(ex: Explanation) -> str:
    title = (f"{ex.spec.source}: {ex.schedule_text}, {ex.micro_batches} {plural(ex.micro_batches, 'micro-batch')}, "
             f"bubble {ex.bubble:.1%}")
    subtitle = (f"{ex.spec.model.name}: {ex.layout_text}; {ex.stages} pipeline rank"
                f"{'s' if ex.stages > 1 else ''}, {ex.chunks} chunk{'s' if ex.chunks > 1 else ''} each"
                + (f", each sequence in {ex.slices} token slices" if ex.slices > 1 else ""))
    return gantt.svg(ex.timeline, chunks=ex.parts, title=title, subtitle=subtitle, part=ex.part,
                     time_label=f"time (forward = 1, backward = 2 per {ex.part}{SPLIT_TIMES if ex.split else ''}; "
                     "communication not counted)")


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
    if not _ours(target):
        print(f"parc explain: {target} exists and was not written by parc explain; it is left as it is\n"
              f"  hint: move it, or write the chart elsewhere with -o DIR", file=sys.stderr)
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
