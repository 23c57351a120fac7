"""The Plan's two printed forms: ``str(plan)`` (readable, stable) and plan.json.

Takes: a ``Plan``. Gives: text for tests and ``parc build --emit plan``, and the
JSON written into each build. Both are deterministic: fields in declaration order,
spans as ``file:line``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re

from parc.dsl.diagnostics import Span
from parc.runtime.layout.layer_settings import fold_runs


def safe_file_name(path: str) -> str:
    """The base name of ``path``, fit for a comment of a Python or shell file.

    Characters that could end a line there (controls, Unicode line breaks), quotes,
    backslashes, backticks and ``$`` become ``?`` (the name also lands in docstrings).
    """
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    return "".join(
        "?" if (ord(c) < 32 or ord(c) == 127 or c in "\u0085\u2028\u2029\"'\\`$") else c
        for c in name
    )


def cite(span: Span | None) -> str:
    """``tiny.par:12`` for a span in the spec, ``--set 1`` for a command-line override,
    ``default`` when parc chose the value, ``tiny.par:12 (planner)`` for a value the
    planner chose for the ``auto`` written there."""
    if span is None:
        return "default"
    line = span.line if type(span.line) is int else "?"
    if type(span.file) is str and re.fullmatch(r"--set [0-9]+", span.file, re.ASCII):
        where = span.file
    else:
        where = f"{safe_file_name(str(span.file))}:{line}"
    return f"{where} (planner)" if getattr(span, "planned", False) is True else where


def _plain(value):
    if isinstance(value, Span):
        return cite(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return {
            f.name: _mapping(getattr(value, f.name)) if f.metadata.get("mapping") else _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
        }
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _mapping(pairs) -> dict:
    """A field marked ``metadata={"mapping": True}``: (name, value) pairs as a JSON object."""
    return {name: _plain(item) for name, item in pairs}


def plan_to_json(plan) -> str:
    data = _plain(plan)
    if data.get("predicted", 0) is None:
        del data["predicted"]  # only a planner-chosen layout carries a prediction
    if data["pipeline"].get("stage_costs", 0) is None:
        del data["pipeline"]["stage_costs"]  # only a schedule ordered by its stages' costs has them
    for part in ("model", "train"):  # a setting only some layouts have (None, or no settings): left out
        record = getattr(plan, part)
        for f in dataclasses.fields(record):
            if f.default in (None, ()) and getattr(record, f.name) == f.default:
                del data[part][f.name]
    if not data["train"]["data"].get("weights", 1):
        del data["train"]["data"]["weights"]  # only a blend has them
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _shape(shape) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ")"


def layer_value(plan, field: str) -> str:
    """A per-block setting as train.py writes it (Note [per-layer layout]): the value
    when every block has it, else a tuple with one per block, runs folded as
    ``("full",) * 2 + ("none",) * 2`` when any run is longer than one."""
    values = plan.per_block(field)
    uniform = plan.uniform(field)
    if uniform is not None:
        return repr(uniform)
    runs = fold_runs(values)
    if all(count == 1 for _, count in runs):
        return repr(tuple(values))
    return " + ".join(f"({value!r},)" + (f" * {count}" if count > 1 else "") for value, count in runs)


LISTED_RANKS = 64
"""``str(plan)`` lists each rank and group up to this many ranks, and the rule beyond."""


def plan_to_text(plan) -> str:
    mesh, tp, sp, batch = plan.mesh, plan.tensor_parallel, plan.sequence_parallel, plan.batch
    lines = [f"plan {plan.model.name} from {plan.source} (parc {plan.parc_version})"]
    axes = " × ".join(f"{a.axis} {a.size}" for a in mesh.axes)
    lines.append(
        f"mesh: {mesh.nodes} node(s) × {mesh.devices_per_node} {mesh.device} = "
        f"{mesh.world_size} rank(s); axes {axes} (outermost first)"
    )
    if mesh.world_size > LISTED_RANKS:
        lines.append(
            f"  ranks 0..{mesh.world_size - 1}: coordinates are the mixed-radix digits of the rank "
            "over the axes, the last fastest; a group shares every other coordinate"
        )
    else:
        for r in mesh.ranks:
            coords = " ".join(f"{a}={i}" for a, i in r.coords)
            lines.append(f"  rank {r.rank}: node {r.node} local {r.local_rank}  {coords}")
        for axis in mesh.axes:
            groups = [g for g in mesh.groups if g.axis == axis.axis]
            if groups and axis.size > 1:
                shown = " ".join("[" + ",".join(str(x) for x in g.ranks) + "]" for g in groups)
                lines.append(f"  {axis.axis} groups: {shown}")
    lines.append(f"tensor parallel: tp {tp.size}")
    for rule in tp.rules:
        tied = f" tied to {rule.tied_to}" if rule.tied_to else ""
        dim = "" if rule.dim is None else f" dim {rule.dim}"
        lines.append(
            f"  {rule.pattern:<24} {rule.style.value:<10}{dim:<6} "
            f"{_shape(rule.full_shape)} -> {_shape(rule.local_shape)}{tied}"
        )
    if sp.enabled:
        lines.append(
            f"sequence parallel: activations {_shape(sp.local_shape)} between the blocks' tensor-parallel regions"
        )
    else:
        lines.append("sequence parallel: off")
    pipe = plan.pipeline
    if pipe.size > 1:
        stages = " ".join(f"[{a},{b})" for a, b in pipe.stage_layers)
        lines.append(
            f"pipeline: pp {pipe.size}, schedule {pipe.schedule}, chunks {pipe.chunks}, "
            f"{pipe.micro_batches} micro-batches, bubble {100 * pipe.bubble_fraction:.1f}%"
        )
        lines.append(f"  layers of each virtual stage: {stages}")
    else:
        lines.append("pipeline: off")
    lines.append(
        f"batch: global {batch.global_batch} = micro {batch.micro_batch} × accum "
        f"{batch.grad_accum} × dp {batch.dp}; {batch.tokens_per_step} tokens/step"
    )
    lines.append(f"model: {plan.model.arch}, {plan.model.parameters:,} parameters")
    for s in plan.model.settings:
        lines.append(f"  {s.name} = {s.value!r}  [{cite(s.span)}]")
    t = plan.train
    lines.append("train:")
    for s in (t.steps, t.seed, t.precision, t.grad_clip, t.log_every, *t.optimizer, *t.lr_schedule):
        lines.append(f"  {s.name} = {s.value!r}  [{cite(s.span)}]")
    for entry in plan.used_settings():
        lines.append(f"  {entry.constant} = {layer_value(plan, entry.name)}  [{cite(plan.blocks[0].span(entry.name))}]")
    if t.zero.value:
        lines.append(f"  {t.zero.name} = {t.zero.value!r}  [{cite(t.zero.span)}]")
    lines.append(f"  {t.kernels.name} = {t.kernels.value!r}  [{cite(t.kernels.span)}]")
    data = t.data
    where = f" {data.path!r} ({data.dtype})" if data.path else ""
    if isinstance(data.path, tuple):
        where += f" blended by {data.weights or 'equal shares'}"
    lines.append(f"  data = {data.kind}{where}  [{cite(data.span)}]")
    if t.eval_every.value:
        val = f"validation file {data.val_path!r}" if data.val_path else (
            "a held-out tail of the file" if data.kind == "tokens" else "a disjoint synthetic stream")
        lines.append(f"  eval = every {t.eval_every.value} steps, {t.eval_batches.value} batches of {val}  [{cite(t.eval_every.span)}]")
    if plan.predicted is not None:
        p = plan.predicted
        lines.append(
            f"predicted (planner, {p.layouts_considered} layouts, {p.accounting} accounting): "
            f"step {p.step_time_s:.4g} s = compute {p.compute_s:.4g} + exposed comm "
            f"{p.exposed_comm_s:.4g} + bubble {p.bubble_s:.4g}; {p.tokens_per_s:,.0f} tokens/s, "
            f"MFU {100 * p.mfu:.1f}%; peak {p.peak_mem_bytes / 2**20:,.1f} MiB per rank"
        )
    return "\n".join(lines) + "\n"
