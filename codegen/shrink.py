"""The shrink of ``parc verify``: a spec's layout at a size a CPU runs in seconds.

Takes: a checked ``Spec`` (``auto`` values allowed: the planner's winner is what gets
shrunk, the layout ``parc build`` would build). Gives: a ``Shrink``, the ``--set``
overrides that turn the spec into a tiny model with the same layout — the same dp, tp,
pp, schedule and chunks, sp, ZeRO stage, recompute and overlap (per-layer lists kept
in their order, stage by stage), kernels — on one node of ``dp·tp·pp`` CPU devices, in
fp32, on synthetic data; each override with the value it replaces and why; and the
overrides of the one-rank reference (the same model with no parallelism at all).

Every smaller value is the first candidate the rules of ``runtime/layout/constraints/``
accept (``constraints.smallest``): no divisibility rule is written here a second time.
Before: ``parc.dsl.load``. After: ``codegen/verify.py`` builds both and runs them.

Note [what verify shrinks]:
- heads and kv_heads: the smallest kv_heads that tp (and every other rule) accepts,
  heads = kv_heads · the spec's heads/kv_heads; head_dim 8 (or the spec's, if smaller).
  A written model.head_dim becomes that head_dim too (hidden = heads · head_dim either way).
  kv_heads stays on the spec's side of tp: a spec whose tp divides kv_heads keeps
  kv_heads ≥ tp, one with tp > kv_heads keeps replicating (Note [KV replication] in
  ``runtime/parallel/tensor/kv_replication.py``), so the shrunk model runs the same attention code.
- ffn: about twice the shrunk hidden; vocab: about 200, padded or not as the spec's is
  (a padded vocab exercises the masked rows of the vocab-parallel loss); seq_len 16.
- layers: per (virtual) stage, one block for each run of equal per-layer settings in
  that stage and at least two (uneven ``stage_layers`` stay uneven, in order).
- the batch: micro_batch at most 2 (as the rules allow), and the fewest
  micro-batches per step the schedule needs (at least 2, to accumulate).
- training: ``steps`` = the verify steps, a constant learning rate without warmup
  (every step at the peak, so the updates move the loss), log every step, fp32 (bf16 rounds differently in
  every layout: it cannot be compared at 1e-5; the same for ``grad_reduce``), no compression
  (the table's ``lossy`` keys: compression is lossy by design, its convergence is tests/parity/
  test_compress.py's claim; the layout around them is still verified), dropout 0 (its masks are drawn per
  rank), synthetic data (the user's token file may not be on this machine and holds ids
  of the full vocab), no checkpoints.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

from parc.dsl.keys import PARALLEL
from parc.dsl.spec import PipelineSchedule, Recompute, Spec
from parc.runtime.layout import constraints
from parc.runtime.layout.layer_settings import SETTINGS, spec_text

from .spec_values import spec_values

HEAD_DIM = 8
SEQ_LEN = 16
VOCAB = 200
BLOCKS_PER_STAGE = 2
MICRO_BATCH = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    key: str
    """The spec key (dotted), as ``--set`` takes it."""
    before: str
    after: str
    why: str

    @property
    def override(self) -> str:
        return f"{self.key}={self.after}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Shrink:
    changes: tuple[Change, ...]
    reference: tuple[str, ...]
    """Overrides, after ``overrides``, that make the one-rank program of the same model."""
    world: int

    @property
    def overrides(self) -> tuple[str, ...]:
        return tuple(change.override for change in self.changes)


def winning_spec(spec: Spec) -> Spec:
    """The spec with the planner's winner in place of ``auto`` (the spec itself when it
    has none); ``Diagnostics`` as ``parc build`` gives them."""
    if spec.layout_complete:
        return spec
    from .passes import check_values, choose_layout
    from .passes.draft import Draft

    draft = check_values.run(spec, Draft())
    return choose_layout.run(spec, draft).spec or spec


# ---- how values are written in --set ---------------------------------------------


def _word(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (Recompute, PipelineSchedule)):
        return value.value
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_word(v) for v in value) + "]"
    return str(value)


def _schedule_word(schedule: PipelineSchedule, chunks: int) -> str:
    if schedule is PipelineSchedule.INTERLEAVED:
        return f"interleaved(chunks = {chunks})"
    return schedule.value


def _lr_schedule_word(lr_schedule, warmup: int) -> str:
    kind = lr_schedule.kind.value
    if kind == "constant":
        return f"constant(warmup = {warmup})"
    if kind == "wsd":
        return (f"wsd(warmup = {warmup}, decay = {lr_schedule.decay}, min_lr_ratio = {lr_schedule.min_lr_ratio!r}, "
                f"shape = {lr_schedule.shape.value})")
    return f"{kind}(warmup = {warmup}, min_lr_ratio = {lr_schedule.min_lr_ratio!r})"


# ---- the shrink ---------------------------------------------------------------------


def shrink(spec: Spec, *, steps: int) -> Shrink:
    """The overrides of Note [what verify shrinks] for ``spec`` (``auto`` resolved first)."""
    chosen = winning_spec(spec)
    changes = _layout_from_planner(spec, chosen)
    values = spec_values(chosen)
    changes += _model(chosen, values)
    changes += _layers(chosen, values)
    changes += _batch(chosen, values)
    changes += _training(chosen, steps)
    world = math.prod(getattr(chosen.parallel, a.name) for a in constraints.AXES if a.in_world)
    changes += _mesh(chosen, world)
    return Shrink(changes=_folded(changes), reference=_reference(values), world=world)


def _folded(changes: list[Change]) -> tuple[Change, ...]:
    """One change per key: the first's ``before`` and why, the last's value (a per-layer
    list the planner chose, then shrunk with the layers)."""
    by_key: dict[str, Change] = {}
    for change in changes:
        first = by_key.get(change.key)
        by_key[change.key] = change if first is None else Change(
            key=change.key, before=first.before, after=change.after, why=f"{first.why}, {change.why}")
    return tuple(by_key.values())


def _changed(key: str, before, after, why: str) -> list[Change]:
    return [] if str(before) == str(after) else [Change(key=key, before=str(before), after=str(after), why=why)]


def _layout_from_planner(spec: Spec, chosen: Spec) -> list[Change]:
    """Every value the spec left ``auto``, written as the planner's choice."""
    par, won = spec.parallel, chosen.parallel
    found = []
    pairs = (
        ("parallel.dp", par.dp, won.dp, _word),
        ("parallel.tp", par.tp, won.tp, _word),
        ("parallel.pp", par.pp, won.pp, _word),
        ("parallel.cp", par.cp, won.cp, _word),
        ("parallel.sp", par.sp, won.sp, _word),
        ("parallel.zero", par.zero, won.zero, _word),
        *(
            (entry.key, par.setting(entry.name), won.setting(entry.name), functools.partial(spec_text, entry))
            for entry in SETTINGS
        ),
        ("train.micro_batch", spec.train.micro_batch, chosen.train.micro_batch, _word),
    )
    for key, given, value, word in pairs:
        if given is None:
            found.append(Change(key=key, before="auto", after=word(value), why="the planner's choice"))
    if par.schedule is None:
        found.append(Change(key="parallel.schedule", before="auto",
                            after=_schedule_word(won.schedule, won.chunks), why="the planner's choice"))
    return found


def _model(spec: Spec, values: dict) -> list[Change]:
    m = spec.model
    head_dim = min(m.head_dim, HEAD_DIM)
    head_dim_written = values.get("head_dim") is not None  # model.head_dim: shrunk with the heads
    ratio = m.heads // m.kv_heads
    kv_written = values["kv_heads"] is not None

    replicated = values["tp"] > m.kv_heads  # Note [what verify shrinks]: same side of tp

    def heads_candidates():
        for kv in range(1, m.kv_heads + 1):
            if (values["tp"] > kv) != replicated:
                continue
            pick = {"heads": kv * ratio, "hidden": kv * ratio * head_dim}
            yield {**pick, "kv_heads": kv} if kv_written else pick

    found = []
    heads = constraints.smallest(values, heads_candidates()) or {}
    values.update(heads)
    why = f"head_dim {head_dim}; the smallest heads tp = {values['tp']} divides"
    found += _changed("model.hidden", m.hidden, values["hidden"], f"heads · head_dim = {values['heads']} · {head_dim}")
    found += _changed("model.heads", m.heads, values["heads"], why)
    if head_dim_written:
        values["head_dim"] = head_dim
        found += _changed("model.head_dim", m.head_dim, head_dim, f"at most {HEAD_DIM}")
    if kv_written:
        found += _changed("model.kv_heads", m.kv_heads, values["kv_heads"], f"heads / kv_heads = {ratio} as in the spec")
    want_ffn = min(m.ffn, 2 * values["hidden"])
    ffn = constraints.smallest(values, ({"ffn": f} for f in range(want_ffn, m.ffn + 1))) or {}
    values.update(ffn)
    found += _changed("model.ffn", m.ffn, values["ffn"], "about 2 · hidden, split by tp")
    padded = m.vocab % m.pad_vocab_to != 0
    vocab = constraints.smallest(values, (
        {"vocab": v} for v in range(min(m.vocab, VOCAB), m.vocab + 1)
        if v == m.vocab or (v % m.pad_vocab_to != 0) == padded
    )) or {}
    values.update(vocab)
    found += _changed("model.vocab", m.vocab, values["vocab"],
                      "padded as in the spec" if padded else f"a multiple of pad_vocab_to = {m.pad_vocab_to}, as in the spec")
    seq_len = constraints.smallest(values, ({"seq_len": t} for t in range(min(m.seq_len, SEQ_LEN), m.seq_len + 1))) or {}
    values.update(seq_len)
    found += _changed("model.seq_len", m.seq_len, values["seq_len"], "short sequences, split by tp under sp")
    if m.dropout:
        found += _changed("model.dropout", m.dropout, "0.0", "dropout masks are drawn per rank")
    return found


def _stage_sizes(spec: Spec) -> list[int]:
    par, layers = spec.parallel, spec.model.layers
    if par.stage_layers is not None:
        return list(par.stage_layers)
    stages = par.pp * (par.chunks if par.schedule is PipelineSchedule.INTERLEAVED else 1)
    return [layers // stages] * stages


def _layers(spec: Spec, values: dict) -> list[Change]:
    """Fewer blocks per stage, each stage keeping the runs of its per-layer settings."""
    par, layers = spec.parallel, spec.model.layers
    per_block = list(zip(*(par.layer_values(entry.name, layers) for entry in SETTINGS)))
    sizes = _stage_sizes(spec)
    starts = list(itertools.accumulate([0] + sizes))
    runs = [[key for key, _ in itertools.groupby(per_block[a:b])] for a, b in zip(starts, starts[1:])]
    if par.stage_layers is not None:
        ranks = {size: rank for rank, size in enumerate(sorted(set(sizes)))}
        counts = [max(len(r), min(size, BLOCKS_PER_STAGE + ranks[size])) for r, size in zip(runs, sizes)]
    else:
        counts = [max(max(len(r) for r in runs), min(sizes[0], BLOCKS_PER_STAGE))] * len(sizes)
    entries = [run + [run[-1]] * (count - len(run)) for run, count in zip(runs, counts)]
    flat = [entry for stage in entries for entry in stage]
    new_layers = len(flat)
    shrunk = {entry.name: tuple(row[i] for row in flat) for i, entry in enumerate(SETTINGS)}
    values.update(layers=new_layers, **shrunk)
    why = f"{_counts_words(counts)} per stage, each stage's per-layer settings in order"
    found = _changed("model.layers", layers, new_layers, why)
    if par.stage_layers is not None:
        found += _changed("parallel.stage_layers", _word(list(par.stage_layers)), _word(counts), "uneven as in the spec")
        values["stage_layers"] = tuple(counts)
    for entry in SETTINGS:
        if isinstance(par.setting(entry.name), tuple):
            found += _changed(entry.key, spec_text(entry, par.setting(entry.name)), spec_text(entry, shrunk[entry.name]),
                              "one value per shrunk layer")
    return found


def _counts_words(counts: list[int]) -> str:
    if len(set(counts)) == 1:
        return f"{counts[0]} block{'s' if counts[0] != 1 else ''}"
    return "[" + ", ".join(map(str, counts)) + "] blocks"


def _batch(spec: Spec, values: dict) -> list[Change]:
    train, par = spec.train, spec.parallel
    start = min(train.micro_batch, MICRO_BATCH)
    micro = constraints.smallest(values, ({"micro_batch": b} for b in range(start, train.micro_batch + 1))) or {}
    values.update(micro)
    per_step = values["micro_batch"] * par.dp
    grad_accum = train.global_batch // (train.micro_batch * par.dp)
    fewest = min(grad_accum, max(2, par.pp))
    batch = constraints.smallest(values, (
        {"global_batch": per_step * a} for a in range(fewest, grad_accum + 1)
    )) or {}
    values.update(batch)
    found = _changed("train.micro_batch", train.micro_batch, values["micro_batch"],
                     f"at most {MICRO_BATCH}, split by the overlap's sub-batches")
    accum = values["global_batch"] // per_step
    found += _changed("train.global_batch", train.global_batch, values["global_batch"],
                      f"micro_batch · grad_accum · dp = {values['micro_batch']} · {accum} · {par.dp}")
    return found


def _training(spec: Spec, steps: int) -> list[Change]:
    train = spec.train
    found = _changed("train.steps", train.steps, steps, "the steps verify compares")
    schedule = train.lr_schedule
    found += _changed("train.schedule", _lr_schedule_word(schedule, schedule.warmup), "constant(warmup = 0)",
                      "every step at the peak learning rate, so each update moves the loss")
    found += _changed("train.log_every", train.log_every, 1, "a record of every step")
    found += _changed("train.precision", train.precision.value, "fp32", "bf16 rounds differently in each layout: "
                      "only fp32 compares at 1e-5")
    found += _changed("train.grad_reduce", train.grad_reduce, "fp32", "bf16 sums round: only fp32 compares at 1e-5")
    par, lossy = spec.parallel, "compressed gradients differ from exact ones by design (Note [compression changes "
    lossy += "numerics]); tests/parity/test_compress.py shows they converge"
    for param in PARALLEL.keys:  # the lossy keys' entries in dsl/keys/parallel.py
        if param.lossy:
            found += _changed(f"parallel.{param.name}", getattr(par, param.name) or param.default, param.default, lossy)
    if par.compress_stages is not None:
        found += [Change(key="parallel.compress_stages", before=_word(list(par.compress_stages)), after="default",
                         why=f"the stages {PARALLEL.key('compress_stages').qualifies} compressed")]
    if train.data.kind.value != "synthetic":
        found += _changed("train.data", _tokens_word(train.data.path), "synthetic",
                          "the token file may not be here, and holds ids of the full vocab")
    if train.checkpoint_every or train.checkpoint_dir:
        found += [Change(key="train.checkpoint", before="every(...)", after="none", why="verify writes no checkpoints")]
    return found


def _mesh(spec: Spec, world: int) -> list[Change]:
    mesh = spec.mesh
    found = _changed("mesh.nodes", mesh.nodes, 1, "one machine: this one")
    found += _changed("mesh.devices_per_node", mesh.devices_per_node, world, "dp·cp·tp·pp CPU ranks, gloo")
    found += _changed("mesh.device", mesh.device, "cpu", "this machine's CPU")
    return found


def _reference(values: dict) -> tuple[str, ...]:
    """The one-rank program: every key of the language's parallel block
    (``dsl/keys/``) at its one-rank value (``_one_rank``), so no axis or option of a
    layout — an axis, a grid of tp, a kind of attention, compression — reaches the reference
    (recompute and overlap change no number: dropping them puts them under test too)."""
    sets = [f"parallel.{param.name}={value}" for param in PARALLEL.keys
            if (value := _one_rank(param, values)) is not None]
    return (*sets, "mesh.devices_per_node=1")


_WORLD = {a.key for a in constraints.AXES}


def _one_rank(param, values: dict) -> str | None:
    """What one rank writes for ``param``: 1 for an axis of the world, else the key's
    default; those whose default is a rule rather than a value (``stage_layers``: an
    even split; the key's ``one_rank``) written as that rule gives at one rank, and
    ``compress_stages`` (only a lossy key's spec writes it) unwritten (``default``);
    None: leave the key as it is."""
    if f"parallel.{param.name}" in _WORLD:
        return "1"
    if param.one_rank is not None:
        return param.one_rank
    if param.name == "stage_layers":
        return None if values.get("stage_layers") is None else f"[{values['layers']}]"
    if param.name == "compress_stages":
        return None if values.get("compress_stages") is None else "default"
    return param.default


def _tokens_word(path) -> str:
    """``tokens("x.bin")``, or a blend's ``tokens(["a.bin", "b.bin"], ...)``, as the spec reads."""
    if isinstance(path, tuple):
        return "tokens([" + ", ".join(f'"{p}"' for p in path) + "], ...)"
    return f'tokens("{path}")'
