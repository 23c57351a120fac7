"""``parc plan``: the planner's ranking of a spec's layouts, as a table or JSON.

Takes: argv (SPEC, --top K, --json, --set, --accounting). Gives: on stdout a table of
the best K layouts (predicted tokens/s, MFU, step time split into compute / exposed
communication / bubble, per-rank peak memory split into parameters / gradients /
optimizer / activations / buffers, whether it fits) and a short "why" comparing the
winner with the runner-up; or the same data as JSON (docs/planner.md). A spec that
gives its layout completely is evaluated alone. Exit status: 0 done, 1 spec errors
or no layout is valid, 2 usage error. Before: ``parc.dsl.load``. After: nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from parc.dsl.diagnostics import Diagnostics
from parc.dsl.spec import Spec
from parc.runtime.layout.layer_settings import folded

from .build import report_stage_errors
from ..planner.cost import Accounting, Estimate, hardware_for
from ..planner.cost import estimate as estimate_layout
from ..planner.cost.hardware import ProfileError
from ..planner.cost.layout import Layout, total_params
from ..planner.cost.options import options
from ..errors import profile_error
from ..planner.why import why
from ..planner.bounded import bounded_search
from ..planner.search import Incomplete, SearchResult, fixed_layout, search


def register(subparsers) -> None:
    from parc.dsl.commands import add_set_argument

    parser = subparsers.add_parser(
        "plan",
        help="rank the layouts of a spec by predicted throughput (the planner)",
        description="Search every valid layout of SPEC's auto keys (or evaluate the layout it "
        "gives), predict step time and per-rank memory, and print the best K.",
    )
    parser.add_argument("spec", metavar="SPEC")
    add_set_argument(parser)
    parser.add_argument("--top", type=int, default=5, metavar="K",
                        help="how many layouts to show (default 5; 0: all)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--accounting", choices=[a.value for a in Accounting], default="parc",
                        help="which training program the figures describe, memory and time both. "
                        "parc (default): parc's trainer (fp32 weights, gradients and AdamW state; "
                        "flash attention). megatron: Megatron-LM, to compare with published figures: "
                        "mixed precision (2+2+12 bytes/param) and Korthikanti's activations, and a "
                        "different time model too: attention without flash (the full s^2 scores, "
                        "their softmax and dropout), bf16 activations and gradients, Megatron's "
                        "op count and optimizer, ZeRO-2 reduce-scatter")
    parser.set_defaults(func=run_plan)


def plan(spec: Spec, accounting: Accounting = Accounting.PARC, *, bounded: bool = False) -> SearchResult:
    """The search result for ``spec`` (one estimate when the spec fixes the layout);
    ``bounded``: its first places only, where it can stop short (Note [the bounded search])."""
    hw = hardware_for(spec)
    layout = fixed_layout(spec)
    if layout is not None:
        item = estimate_layout(spec, layout, hw, accounting)
        return SearchResult(estimates=(item,), considered=1, fitting=int(item.fits))
    return (bounded_search if bounded else search)(spec, hw, accounting)


# ---- text -------------------------------------------------------------------------

def _tokens(value: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def _count(value: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return str(int(value))


def _time_unit(values) -> tuple[str, float]:
    top = max(values, default=0.0)
    if top >= 10:
        return "s", 1.0
    if top >= 10e-3:
        return "ms", 1e-3
    return "µs", 1e-6


def _mem_unit(values) -> tuple[str, float]:
    return ("GiB", 2.0**30) if max(values, default=0.0) >= 2.0**30 else ("MiB", 2.0**20)


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def settings(layout) -> str:
    parts = [cell for entry in options() if (cell := entry.column(layout)) is not None]  # cp's kind, a tp grid
    if layout.ep > 1:
        parts.append(f"ep{layout.ep}")
    if layout.pp > 1:
        parts.append(layout.schedule_words)
    if layout.sp:
        parts.append("sp")
    if layout.zero:
        parts.append(f"zero{layout.zero}")
    if layout.compress != "none":
        parts.append(layout.compress)
    parts += layout.settings_words()
    return " ".join(parts) or "-"


def _degrees(coarse: int, per_layer) -> str:
    """A degree, or one per layer with runs folded: ``[2 ×3, 1]``."""
    return str(coarse) if per_layer is None else folded(per_layer)


def table(spec: Spec, result: SearchResult, rows: tuple[Estimate, ...], accounting) -> str:
    hw = hardware_for(spec)
    mesh = spec.mesh
    world = mesh.nodes * mesh.devices_per_node
    memory = "unknown memory" if hw.memory is None else f"{hw.memory / 1e9:g} GB each"
    source = f", profile {hw.profile}" if hw.profile else ""
    lines = [
        f"parc plan {spec.source}: {spec.model.name} ({_count(total_params(spec.model))} parameters) on "
        f"{mesh.nodes} × {mesh.devices_per_node} {mesh.device} ({world} devices, {memory}{source})",
        f"{result.considered} layout{'s' if result.considered != 1 else ''} considered, {result.fitting} fit"
        f" in memory; {len(rows)} shown, best first ({accounting.value} accounting; "
        f"global batch {spec.train.global_batch} × {spec.model.seq_len} tokens)",
    ]
    if mesh.device == "cpu" and hw.profile is None:
        lines.append("cpu without a profile: times are placeholders (50 GFLOP/s per rank); "
                     "run `parc profile -o FILE` and set mesh { profile = \"FILE\" }")
    lines.append("")
    t_unit, t_scale = _time_unit([r.time.step for r in rows])
    m_unit, m_scale = _mem_unit([r.memory.total for r in rows])
    header = [
        ("#", ">"), ("dp", ">"), ("tp", ">"), ("pp", ">"), ("mb×acc", ">"), ("settings", "<"),
        ("tokens/s", ">"), ("MFU", ">"),
        (f"step {t_unit}", ">"), ("compute", ">"), ("comm", ">"), ("bubble", ">"),
        (f"mem {m_unit}", ">"), ("params", ">"), ("grads", ">"), ("optim", ">"), ("activ", ">"),
        ("other", ">"), ("", "<"),
    ]
    body = []
    for index, item in enumerate(rows, 1):
        lay, tm, mem = item.layout, item.time, item.memory
        note = "" if item.fits else "✗ does not fit"
        if item.fits and not item.buildable:
            note = "not buildable yet"
        body.append([
            str(index), _degrees(lay.dp, lay.layer_dp), _degrees(lay.tp, lay.layer_tp), str(lay.pp),
            f"{lay.micro_batch}×{lay.grad_accum(spec.train.global_batch)}", settings(lay),
            _tokens(item.tokens_per_s), f"{100 * item.mfu:.1f}%",
            _number(tm.step / t_scale), _number(tm.compute / t_scale),
            _number(tm.exposed_comm / t_scale), _number(tm.bubble / t_scale),
            _number(mem.total / m_scale), _number(mem.params / m_scale), _number(mem.grads / m_scale),
            _number(mem.optimizer / m_scale), _number(mem.activations / m_scale),
            _number(mem.buffers / m_scale), note,
        ])
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, (h, _) in enumerate(header)]
    bars = (5, 7, 11)  # a │ after these columns: layout │ rate │ time │ memory

    def line(cells) -> tuple[str, list[int]]:
        out, starts, width = [], [], 0
        for i, (cell, (_, align)) in enumerate(zip(cells, header)):
            piece = cell.rjust(widths[i]) if align == ">" else cell.ljust(widths[i])
            starts.append(width)
            out.append(piece)
            width += len(piece) + 2
            if i in bars:
                out.append("│")
                width += 3
        return "  ".join(out).rstrip(), starts

    head, starts = line([h for h, _ in header])
    title = list(" " * len(head))
    for column, name in ((8, "step time"), (12, "peak memory per rank")):
        title[starts[column]:starts[column] + len(name)] = name
    rule = ["─" * w for w in widths[:-1]] + [""]
    lines += ["".join(title).rstrip(), head, line(rule)[0]]
    lines += [line(r)[0] for r in body]
    lines.append("")
    lines += why(spec, result, hw)
    return "\n".join(lines) + "\n"


# ---- json -------------------------------------------------------------------------

def to_json(spec: Spec, result: SearchResult, rows, accounting) -> dict:
    hw = hardware_for(spec)
    winner = result.winner
    return {
        "spec": spec.source,
        "model": spec.model.name,
        "parameters": total_params(spec.model),
        "mesh": {
            "nodes": spec.mesh.nodes, "devices_per_node": spec.mesh.devices_per_node,
            "device": spec.mesh.device, "device_memory_bytes": hw.memory,
            "peak_flops": hw.peak_flops, "profile": hw.profile,
        },
        "accounting": accounting.value,
        "considered": result.considered,
        "fitting": result.fitting,
        "winner": None if winner is None else result.estimates.index(winner),
        "best_uniform_step_time_s": None if result.best_uniform is None else result.best_uniform.time.step,
        "layouts": [layout_json(spec, item) for item in rows],
        "why": why(spec, result, hw),
    }


def _json_value(value):
    """A per-layer setting in JSON: one value, or a list of one per block."""
    return list(value) if isinstance(value, tuple) else value


def layout_fields(layout: Layout) -> dict:
    """Every field of the planner's ``Layout`` (cost/layout.py: one per axis, option and
    per-layer setting), so a field added there reaches ``--json`` with no edit here: ``dp``
    and ``tp`` are lists of one degree per block where they vary (``layer_tp`` is folded
    into ``tp``), a tuple (a grid's shape) as a list, None as null."""
    fields = {f.name: _json_value(getattr(layout, f.name)) for f in dataclasses.fields(layout) if f.name != "layer_tp"}
    return fields | {"dp": _json_value(layout.layer_dp or layout.dp), "tp": _json_value(layout.layer_tp or layout.tp)}


def layout_json(spec: Spec, item: Estimate) -> dict:
    lay, tm, mem = item.layout, item.time, item.memory
    return {
        **layout_fields(lay),
        "grad_accum": lay.grad_accum(spec.train.global_batch),
        "step_time_s": tm.step, "tokens_per_s": item.tokens_per_s,
        "tflops_per_device": item.tflops_per_device, "mfu": item.mfu,
        "peak_mem_bytes": mem.total, "fits": item.fits, "buildable": item.buildable,
        "peak_pipeline_rank": item.peak_rank,
        "time": {
            "compute_s": tm.compute, "exposed_comm_s": tm.exposed_comm, "bubble_s": tm.bubble,
            "tp_comm_s": tm.tp_comm, "dp_comm_s": tm.dp_comm, "pp_comm_s": tm.pp_comm, "ep_comm_s": tm.ep_comm,
        },
        "memory": {
            "params_bytes": mem.params, "grads_bytes": mem.grads, "optimizer_bytes": mem.optimizer,
            "activations_bytes": mem.activations, "buffers_bytes": mem.buffers,
        },
    }


def run_plan(args: argparse.Namespace) -> int:
    from parc.dsl.commands import load_or_report

    if args.top < 0:
        print("parc: error: --top must be 0 (all) or more", file=sys.stderr)
        return 2
    spec = load_or_report(args.spec, args.overrides, buildable=False)  # plan predicts zero 3, fp16
    if spec is None:
        return 1
    accounting = Accounting(args.accounting)
    try:
        result = plan(spec, accounting, bounded=args.top > 0)  # --top 0 shows every layout
    except ProfileError as exc:  # quoted at the spec's mesh.profile, as parc build does
        return report_stage_errors(Diagnostics([profile_error(spec, exc)]), args.spec, args.overrides)
    if not result.estimates:
        print(f"parc plan {spec.source}: no valid layout for this mesh and batch "
              "(check that global_batch and the mesh leave a dp·cp·tp·pp split)", file=sys.stderr)
        return 1
    try:
        text = _output(spec, result, accounting, args)
    except Incomplete:  # Note [the bounded search]: it stopped short of what the output reads
        text = _output(spec, plan(spec, accounting), accounting, args)
    sys.stdout.write(text)
    return 0


def _output(spec: Spec, result: SearchResult, accounting, args) -> str:
    """The table or the JSON of ``result``'s first ``--top`` layouts."""
    rows = result.estimates if args.top == 0 else result.estimates[: args.top]
    if len(rows) < args.top and not result.complete:
        raise Incomplete
    if args.json:
        return json.dumps(to_json(spec, result, rows, accounting), indent=1, sort_keys=True) + "\n"
    return table(spec, result, rows, accounting)
