"""What parc build cannot generate yet: the UNBUILDABLE table and the build-kind rules, ZeRO, compression, 2D tp."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Callable
from ..layer_settings import SETTINGS, spec_text

from ..rule_engine import BUILD, KEYS, Violation, _violation, divisors, entries, rule


@dataclass(frozen=True, slots=True)
class Unbuildable:
    name: str
    """The value (a name of ``KEYS``) that asks for the feature."""
    asked: Callable[[object], bool]
    feature: str
    instead: str


UNBUILDABLE = (
    Unbuildable("optimizer", lambda name: name != "adamw", "", "use optimizer = adamw(...)"),
)
"""One entry per feature ``parc build`` cannot generate: the issue that builds it deletes
its entry (and adds its pass). Rule kind ``BUILD``: ``parc plan`` still predicts them."""


def _unbuildable(entry: Unbuildable) -> Callable:
    def check(**values):
        value = values[entry.name]
        if not entry.asked(value):
            return None
        feature = entry.feature or f"{entry.name} {value!r}"
        return Violation(code="PAR0802", blame=(KEYS[entry.name],),
                         message=f"{feature} is not supported yet by parc build",
                         hint=f"{entry.instead}; a later version of parc generates it")

    check.__signature__ = inspect.Signature([inspect.Parameter(entry.name, inspect.Parameter.KEYWORD_ONLY)])
    return check


for _entry in UNBUILDABLE:
    rule("PAR0802", BUILD, name=f"build_{_entry.name}")(_unbuildable(_entry))


@rule("PAR0241")
def zero_options_need_zero3(zero, zero_prefetch, zero_shard):
    """``zero_prefetch`` and ``zero_shard`` say how ZeRO-3 gathers and shards parameters."""
    if zero == 3 or (zero_prefetch == 1 and zero_shard == "dp"):
        return None
    key, value = ("zero_shard", zero_shard) if zero_shard != "dp" else ("zero_prefetch", zero_prefetch)
    return _violation("PAR0241", (f"parallel.{key}", "parallel.zero"),
                      f"{key} = {value} needs zero = 3 (sharded parameters), but zero = {zero}",
                      f"set zero = 3, or remove {key}")


@rule("PAR0243")
def zero_needs_data_ranks(zero, dp, cp=None, tp=None, layer_dp=None, ep=None, etp=None):
    """ZeRO shards over the data-parallel ranks (dp·cp; a per-layer dp list: its largest
    degree); expert-parallel parameters over their edp = dp·cp·tp / (ep·etp) ranks (Note
    [experts under ZeRO] in zero.py). With one such rank it shards nothing: as ``sp = true``
    with tp = 1 (PAR0209), a setting that does nothing is refused."""
    ranks = max(layer_dp or (dp,)) * (cp or 1)
    expert_ranks = ranks * (tp or 1) // ((ep or 1) * (etp or 1)) if (ep or 1) > 1 else ranks
    if zero == 0 or ranks > 1 or expert_ranks > 1:
        return None
    return _violation("PAR0243", ("parallel.zero", "parallel.dp"),
                      f"zero = {zero} shards over the data-parallel ranks, but dp·cp = {dp}·{cp or 1} = 1: "
                      "it does nothing",
                      "remove zero (or zero = 0), or use more data-parallel ranks (dp > 1)")


@rule("PAR0242")
def zero_shard_node(zero_shard, devices_per_node, tp, dp, cp=None):
    """HSDP shards over the dp (× cp) ranks of one node: s = devices_per_node / tp of them
    (all dp·cp when fewer); the groups must tile the dp·cp ranks."""
    if zero_shard != "node":
        return None
    group = dp * (cp or 1)
    per_node = devices_per_node // tp if devices_per_node % tp == 0 else 0
    if per_node and (per_node % group == 0 or group % per_node == 0):
        return None
    return _violation("PAR0242", ("parallel.zero_shard", "mesh.devices_per_node"),
                      f"zero_shard = node shards over the dp·cp ranks of one node, devices_per_node / tp = "
                      f"{devices_per_node} / {tp}, which must divide or be a multiple of dp·cp = {group}",
                      "use zero_shard = dp, or a devices_per_node that holds whole groups of dp ranks")


@rule("PAR0826", BUILD)
def build_zero3_split_backward(zero, schedule):
    """A zero_bubble W op runs after the block's backward (B) has freed ZeRO-3's gathered
    parameters (``fsdp.py``, Note [when a unit is gathered]); W would need a third gather."""
    if zero != 3 or schedule not in ("zero_bubble", "zero_bubble_v"):  # schedule.SPLIT_BACKWARD (not imported)
        return None
    return _violation("PAR0826", ("parallel.schedule", "parallel.zero"),
                      f"zero = 3 with schedule = {schedule} is not supported yet by parc build: "
                      "the weight-gradient (W) ops run after the block's gathered parameters are freed",
                      "use schedule = 1f1b with zero = 3, or zero = 2 with zero_bubble")


@rule("PAR0820", BUILD)
def build_grad_reduce(grad_reduce, zero):
    """A bf16 gradient reduction is built for ZeRO 0 (runtime/parallel/data/dp.py's buckets); ZeRO 1/2/3
    reduce (and reduce-scatter) in fp32 only yet."""
    if grad_reduce != "bf16" or zero == 0:
        return None
    return _violation("PAR0820", ("train.grad_reduce", "parallel.zero"),
                      f"grad_reduce = bf16 with zero = {zero} (gradients reduced in bf16 into the "
                      "optimizer's shards) is not supported yet by parc build",
                      "use grad_reduce = fp32 (the default) with zero >= 1, or zero = 0 with grad_reduce = bf16")


@rule("PAR0813", BUILD)
def build_expert_parallel_zero(ep, zero, etp=1, zero_shard=None):
    """ZeRO 1/2 keep the experts in a flat buffer of their own over edp (zero.py, Note
    [experts under ZeRO]), ZeRO-3 in units of their own over edp (fsdp.py, Note [experts
    as units]); HSDP (``zero_shard = node``) would replicate those units over nodes, which
    is not built."""
    if ep * (etp or 1) == 1 or zero != 3 or zero_shard != "node":
        return None
    return _violation("PAR0813", ("parallel.zero_shard", "parallel.ep"),
                      f"zero_shard = node with expert parallelism (ep = {ep}, etp = {etp or 1}) "
                      "is not supported yet by parc build",
                      "write zero_shard = dp with ep > 1 (the experts' units shard over their edp ranks), or ep = 1")


def _drops(capacity_factor) -> bool:
    """Whether a capacity drops tokens: ``none`` (dropless, the default) is the word as
    written at check time and None in a built ``Spec``."""
    return capacity_factor not in (None, "none")


@rule("PAR0811", BUILD)
def build_moe_context_capacity(capacity_factor, cp=None):
    """A capacity keeps each expert's best tokens of the micro-batch; under cp a rank routes
    a chunk of each sequence, and the drop ranking over the whole micro-batch is not built
    (Note [MoE under context parallelism]: dropless routing is)."""
    if not _drops(capacity_factor) or (cp or 1) == 1:
        return None
    return _violation("PAR0811", ("model.capacity_factor", "parallel.cp"),
                      f"capacity_factor = {capacity_factor} with cp = {cp} is not supported yet by parc build",
                      "write capacity_factor = none (dropless) with cp > 1, or cp = 1")


@rule("PAR0830", BUILD)
def build_moe_sp_capacity(capacity_factor, sp):
    """A capacity keeps each expert's best tokens of the micro-batch; under sp a rank routes
    a sequence shard, and the drop ranking over the whole micro-batch is not built."""
    if not _drops(capacity_factor) or sp is not True:
        return None
    return _violation("PAR0830", ("model.capacity_factor", "parallel.sp"),
                      f"capacity_factor = {capacity_factor} with sp = true is not supported yet by parc build",
                      "write capacity_factor = none (dropless) with sp = true, or sp = false")


@rule("PAR0270", BUILD)
def build_compress_zero(compress, zero):
    """PowerSGD and top-k replace the dp all-reduce of whole gradients (compress.py); under
    ZeRO 1/2 each rank then keeps its slice of the decompressed mean (zero.py, Note
    [compression under ZeRO]). ZeRO-3's gradients leave backward reduce-scattered, unit by
    unit, and have no compressed form yet."""
    if compress == "none" or zero != 3:
        return None
    return _violation("PAR0270", ("parallel.compress", "parallel.zero"),
                      f"compress = {compress} with zero = 3 is not supported yet by parc build: "
                      "ZeRO-3 reduce-scatters whole gradients into the shards as backward produces them",
                      f"use zero = 1 or 2 with compress = {compress}, or compress = none with zero = 3")


@rule("PAR0271")
def compress_pp_needs_pipeline(compress_pp, pp, compress_stages=None):
    """``compress_pp`` compresses what pipeline stages send back; ``compress_stages``
    names stages 1 .. pp-1 (stage 0 sends nothing back) and needs ``compress_pp``."""
    if compress_pp != "none" and pp == 1:
        return _violation("PAR0271", ("parallel.compress_pp", "parallel.pp"),
                          f"compress_pp = {compress_pp} compresses gradients sent between pipeline stages, "
                          "but pp = 1", "use pp >= 2, or remove compress_pp")
    if compress_stages is None:
        return None
    if compress_pp == "none":
        return _violation("PAR0271", ("parallel.compress_stages",),
                          "compress_stages says which stages send compressed gradients, but compress_pp = none",
                          "add compress_pp = lowrank(rank = 4), or remove compress_stages")
    wrong = [s for s in compress_stages if not 1 <= s < pp]
    if wrong:
        return _violation("PAR0271", ("parallel.compress_stages",),
                          f"compress_stages = {list(compress_stages)}: stage {wrong[0]} is not one of 1 .. pp-1 = "
                          f"{pp - 1} (stage 0 sends no gradient back)",
                          "list only stages among " + ", ".join(str(stage) for stage in range(1, pp)))
    return None


@rule("PAR0273", BUILD)
def build_compress_pp_interleaved(compress_pp, chunks):
    """The codec keys its state by virtual stage; ``compress_stages`` of an interleaved
    schedule (several chunks per rank) has no meaning defined yet."""
    if compress_pp == "none" or chunks == 1:
        return None
    return _violation("PAR0273", ("parallel.compress_pp", "parallel.schedule"),
                      f"compress_pp = {compress_pp} with an interleaved schedule (chunks = {chunks}) is not "
                      "supported yet by parc build",
                      "use schedule = 1f1b (or gpipe, zero_bubble) with compress_pp")


@rule("PAR0276", BUILD)
def build_compress_schedule(schedule, compress="none", compress_pp="none", pp=1):
    """Chimera sums its two stage replicas' gradients and ZB-V hands the V's turn over in
    memory: neither meets the compressed reductions or the codec's per-boundary state
    yet, and zero_bubble's split backward does not run the pp codec."""
    if pp == 1:
        return None
    if compress not in (None, "none") and schedule in ("chimera", "zero_bubble_v"):
        key, value = "compress", compress
    elif compress is None and schedule in ("chimera", "zero_bubble_v"):
        key, value = "compress", "auto"
    elif compress_pp != "none" and schedule in ("chimera", "zero_bubble_v", "zero_bubble"):
        key, value = "compress_pp", compress_pp
    else:
        return None
    return _violation("PAR0276", (f"parallel.{key}", "parallel.schedule"),
                      f"{key} = {value} with schedule = {schedule} is not supported yet by parc build",
                      f"use schedule = 1f1b (or gpipe) with {key}, or {key} = none")


@rule("PAR0274")
def tp_shape_product(tp_shape, tp):
    """2D tensor parallelism arranges the tp ranks as an R × C mesh: R·C = tp."""
    rows, cols = tp_shape
    if rows * cols == tp:
        return None
    return _violation("PAR0274", ("parallel.tp_shape", "parallel.tp"),
                      f"tp_shape = ({rows}, {cols}) arranges {rows}·{cols} = {rows * cols} ranks, but tp = {tp}",
                      f"write tp_shape = (1, {tp}), or a pair whose product is {tp}")


def tp_2d(tp_shape) -> bool:
    """``tp_shape = (R, C)`` with R > 1: the tp ranks as a 2D grid (Note [2D tensor
    parallelism] in layers2d.py); ``(1, tp)`` and no tp_shape are today's 1D."""
    return tp_shape is not None and tuple(tp_shape)[0] > 1


def _setting_text(name: str) -> Callable:
    entry = next(e for e in SETTINGS if e.name == name)
    return lambda value: spec_text(entry, value)


def _list_text(value) -> str:
    return "[" + ", ".join(str(v) for v in value) + "]"


_NOT_WITH_2D = (
    # (value name, is it on?, the spec key, what to write instead, the value as the spec writes it)
    ("cp", lambda v: v > 1, "parallel.cp", "cp = 1", str),
    ("experts", lambda v: v > 0, "model.experts", "a dense model", str),
    ("layer_tp", lambda v: v is not None, "parallel.tp", "one tp for every layer", _list_text),
    ("overlap", lambda v: any(k is not None and k > 1 for k in entries(v)), "parallel.overlap", "overlap = none",
     _setting_text("overlap")),
    ("compress", lambda v: v not in ("none", None), "parallel.compress", "compress = none", str),
    ("compress_pp", lambda v: v not in ("none", None), "parallel.compress_pp", "compress_pp = none", str),
)


@rule("PAR0277", BUILD)
def build_tp_2d_with(tp_shape, cp=None, experts=None, layer_tp=None, overlap=None,
                     compress=None, compress_pp=None):
    """2D tensor parallelism is built for dense models with dp, pp, sp (over a row: Note [2D
    sequence parallelism]), ZeRO 1/2/3, recompute and any precision; the features below shard
    or move the hidden state in ways the 2D layers do not meet yet (cp; expert dispatch;
    per-layer tp; sub-batch overlap; the compressed dp and pp paths)."""
    if not tp_2d(tp_shape):
        return None
    values = dict(cp=cp, experts=experts, layer_tp=layer_tp, overlap=overlap,
                  compress=compress, compress_pp=compress_pp)
    for name, on, key, instead, text in _NOT_WITH_2D:
        value = values[name]
        if value is not None and on(value):
            rows, cols = tp_shape  # the value as written: `tp = [4, 4]`
            return _violation("PAR0277", (key, "parallel.tp_shape"),
                              f"tp_shape = ({rows}, {cols}) (2D tensor parallelism) with "
                              f"{key.split('.')[1]} = {text(value)} "
                              "is not supported yet by parc build",
                              f"use {instead} with tp_shape = ({rows}, {cols}), or tp_shape = (1, {rows * cols}) (1D)")
    return None


@rule("PAR0278", BUILD)
def build_tp_2d_kv_heads(tp_shape, kv_heads):
    """2D tensor parallelism splits the kv heads over a row's C ranks; it does not replicate
    them (Note [KV replication] is 1D's), so C must divide kv_heads."""
    if not tp_2d(tp_shape):
        return None
    rows, cols = tp_shape
    if kv_heads % cols == 0:
        return None
    fits = [c for c in divisors(kv_heads) if (rows * cols) % c == 0]
    return _violation("PAR0278", ("parallel.tp_shape", "model.kv_heads"),
                      f"tp_shape = ({rows}, {cols}) splits the kv heads over C = {cols} ranks, "
                      f"but C does not divide kv_heads = {kv_heads} (2D does not replicate kv heads)",
                      "C must be one of " + ", ".join(map(str, fits)) + f" (and R = {rows * cols} / C)")
