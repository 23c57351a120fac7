"""The Gantt chart of a pipeline schedule, as SVG text.

Takes: a ``Timeline`` (``runtime/schedule_sim.simulate``), the chunks per rank and a
title. Gives: ``svg(...) -> str``: one row per pipeline rank, time along x, one box per
forward/backward with its micro-batch number inside (``micro.chunk`` and a shade per
chunk when interleaved; ``micro.slice`` and a shade per token slice under a sliced schedule), forward and backward in two colours (a split backward's B and
W in two: backward and weight gradient), idle time left grey, a
legend and axis labels. Hand-written SVG, no dependency; the same input gives the same
bytes (no timestamps, fixed number formats). Before: ``explain`` builds the timeline.
After: ``explain`` writes the text to ``schedule.svg``.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from parc.runtime.schedules.schedule import Op

FONT = "DejaVu Sans, Arial, Helvetica, sans-serif"
CHAR = 6.6  # width of one character at font-size 11, generously
ROW, BOX = 30, 24  # row pitch and box height, px
LEFT, RIGHT, TOP = 78, 24, 64
MAX_WIDTH = 4000  # beyond this the time scale shrinks and labels that no longer fit go
# Light to medium tints, so black labels read on every chunk's shade.
FORWARD = ((0xC6, 0xDB, 0xEF), (0x4E, 0x9A, 0xD0))
BACKWARD = ((0xFD, 0xD9, 0xB4), (0xF0, 0x88, 0x3A))
WEIGHT = ((0xC7, 0xE9, 0xC0), (0x41, 0xAB, 0x5D))  # W of a split backward (schedule.py, Note [B and W])
IDLE, AXIS = "#eeeeee", "#555555"


def _mix(pair, chunk: int, chunks: int) -> str:
    light, dark = pair
    t = 0.55 if chunks == 1 else chunk / (chunks - 1)
    return "#" + "".join(f"{round(a + (b - a) * t):02x}" for a, b in zip(light, dark))


KINDS = {Op.FORWARD: (FORWARD, "forward"), Op.BACKWARD: (BACKWARD, "backward"), Op.WEIGHT: (WEIGHT, "weight")}


def colour(op: Op, chunk: int, chunks: int) -> str:
    return _mix(KINDS[op][0], chunk, chunks)


def label(op: Op, micro: int, chunk: int, chunks: int) -> str:
    return f"{op.value}{micro}.{chunk}" if chunks > 1 else f"{op.value}{micro}"


def number(x: float) -> str:
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _tick_step(unit_px: float) -> int:
    for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000):
        if step * unit_px >= 40:
            return step
    return 10000


MARK = "<!-- written by parc explain -->"
"""The chart's second line: ``explain`` replaces a ``schedule.svg`` only when it starts so."""


def svg(timeline, *, chunks: int, title: str, subtitle: str, time_label: str, part: str = "chunk") -> str:
    """The chart of ``timeline`` (times in forward units) as a complete SVG document.
    ``part``: what an event's ``chunk`` is (``"slice"``: a sliced schedule's token slice)."""
    ranks = len(timeline.ranks)
    makespan = max(timeline.makespan, 1.0)
    widest = max((len(label(e.op, e.micro, e.chunk, chunks)) for r in timeline.ranks for e in r), default=2)
    unit = max(16.0, widest * CHAR + 8)
    if unit * makespan > MAX_WIDTH:
        unit = max(MAX_WIDTH / makespan, 2.0)
    plot_w = unit * makespan
    plot_h = ROW * ranks
    legend_y = TOP + plot_h + 64
    width = LEFT + plot_w + RIGHT
    split = any(e.op is Op.WEIGHT for events in timeline.ranks for e in events)
    width = max(width, LEFT + len(time_label) * CHAR + RIGHT, LEFT + _legend_width(chunks, split, part) + RIGHT)
    height = legend_y + 30
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        MARK,
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{number(width)}" height="{number(height)}" '
        f'viewBox="0 0 {number(width)} {number(height)}" font-family="{FONT}" font-size="11">',
        f'<rect x="0" y="0" width="{number(width)}" height="{number(height)}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>',
        f'<text x="{LEFT}" y="42" font-size="12" fill="#333333">{escape(subtitle)}</text>',
    ]
    stroke = ' stroke="#ffffff" stroke-width="1"' if unit >= 8 else ""  # box edges, while boxes are wide
    # ---- rows: grey lane (idle shows through), rank label, one box per F/B
    for rank, events in enumerate(timeline.ranks):
        y = TOP + rank * ROW
        box_y = y + (ROW - BOX) / 2
        out.append(f'<rect x="{LEFT}" y="{number(box_y)}" width="{number(plot_w)}" height="{BOX}" fill="{IDLE}"/>')
        out.append(f'<text x="{LEFT - 8}" y="{number(y + ROW / 2 + 4)}" text-anchor="end">rank {rank}</text>')
        for event in events:
            x = LEFT + event.start * unit
            w = (event.end - event.start) * unit
            name = label(event.op, event.micro, event.chunk, chunks)
            kind = KINDS[event.op][1]
            out.append(
                f'<rect class="event {kind}" x="{number(x)}" y="{number(box_y)}" width="{number(w)}" height="{BOX}" '
                f'fill="{colour(event.op, event.chunk, chunks)}"{stroke}>'
                f"<title>rank {rank} {kind} micro-batch {event.micro}"
                f"{f' {part} {event.chunk}' if chunks > 1 else ''}: {number(event.start)} to {number(event.end)}</title></rect>"
            )
            if len(name) * CHAR + 4 <= w:
                out.append(f'<text x="{number(x + w / 2)}" y="{number(box_y + BOX / 2 + 4)}" '
                           f'text-anchor="middle">{name}</text>')
    # ---- time axis
    axis_y = TOP + plot_h + 4
    out.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{number(LEFT + plot_w)}" y2="{axis_y}" stroke="{AXIS}"/>')
    step = _tick_step(unit)
    for t in range(0, int(makespan) + 1, step):
        x = LEFT + t * unit
        out.append(f'<line x1="{number(x)}" y1="{axis_y}" x2="{number(x)}" y2="{axis_y + 5}" stroke="{AXIS}"/>')
        out.append(f'<text x="{number(x)}" y="{axis_y + 17}" text-anchor="middle" fill="{AXIS}">{t}</text>')
    label_x = max(LEFT + plot_w / 2, LEFT + len(time_label) * CHAR / 2)
    out.append(f'<text x="{number(label_x)}" y="{axis_y + 34}" text-anchor="middle" '
               f'fill="#333333">{escape(time_label)}</text>')
    out.append(f'<text x="{LEFT - 8}" y="{TOP - 6}" text-anchor="end" fill="#333333">pp rank</text>')
    # ---- legend
    x = float(LEFT)
    for fill, text in _legend(chunks, split, part):
        if fill is None:
            out.append(f'<text x="{number(x)}" y="{legend_y}" fill="#333333">{text}</text>')
            continue
        out.append(f'<rect x="{number(x)}" y="{legend_y - 11}" width="14" height="14" fill="{fill}" '
                   'stroke="#999999" stroke-width="0.5"/>')
        out.append(f'<text x="{number(x + 19)}" y="{legend_y}">{text}</text>')
        x += 19 + len(text) * CHAR + 18
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _legend(chunks: int, split: bool = False, part: str = "chunk") -> list[tuple[str | None, str]]:
    """(fill, text) of each legend entry; fill None for a plain note."""
    entries: list[tuple[str | None, str]] = []
    shown = [(Op.FORWARD, "forward"), (Op.BACKWARD, "backward")]
    if split:
        shown = [(Op.FORWARD, "forward F"), (Op.BACKWARD, "input grad B"), (Op.WEIGHT, "weight grad W")]
    for op, name in shown:
        if chunks == 1:
            entries.append((colour(op, 0, 1), name))
        else:
            entries += [(colour(op, c, chunks), f"{name} {part} {c}") for c in range(chunks)]
    entries.append((IDLE, "idle (bubble)"))
    entries.append((None, f"box: micro-batch.{part}" if chunks > 1 else "box: micro-batch"))
    return entries


def _legend_width(chunks: int, split: bool = False, part: str = "chunk") -> float:
    return sum(19 + len(text) * CHAR + 18 if fill else len(text) * CHAR
               for fill, text in _legend(chunks, split, part))
