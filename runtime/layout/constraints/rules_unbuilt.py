"""What parc build cannot generate yet that is not a pair (the pairs are unbuilt_pairs.py's rows): the
UNBUILDABLE values; and the ZeRO, compression and 2D tp rules of this concern."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Callable

from ..rule_engine import BUILD, Violation, _violation, divisors, rule
from ..rule_keys import KEYS, declare
from .unbuilt_pairs import tp_2d

declare(  # Note [a feature declares its values]: ZeRO-3's options, the pipeline codec's
    zero_prefetch="parallel.zero_prefetch", zero_shard="parallel.zero_shard",
    compress_pp="parallel.compress_pp", compress_stages="parallel.compress_stages",
)


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


@rule("PAR0813")
def zero_shard_node_experts(zero, zero_shard, devices_per_node, tp, dp, ep, cp=None, etp=None):
    """HSDP with ep·etp = F > 1 shards each MoE block's experts over the edp ranks of one node
    (fsdp.py, Note [experts as units]): a stage's S = dp·cp·tp ranks fold as edp·ep·etp, an
    edp group every F-th of them, so it splits evenly over nodes when a node holds whole
    stages, or when F divides devices_per_node or devices_per_node divides F."""
    folds = ep * (etp or 1)
    if zero != 3 or zero_shard != "node" or folds == 1:
        return None
    stage = dp * (cp or 1) * tp
    if devices_per_node % stage == 0 or devices_per_node % folds == 0 or folds % devices_per_node == 0:
        return None
    return _violation("PAR0813", ("parallel.zero_shard", "parallel.ep"),
                      f"zero_shard = node shards the experts over the edp ranks of one node, but ep·etp = {folds} "
                      f"neither divides nor is a multiple of devices_per_node = {devices_per_node}: the edp ranks "
                      "do not split evenly over nodes",
                      "use an ep·etp that divides devices_per_node (or a multiple of it), or zero_shard = dp")






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




@rule("PAR0274")
def tp_shape_product(tp_shape, tp):
    """2D tensor parallelism arranges the tp ranks as an R × C mesh: R·C = tp."""
    rows, cols = tp_shape
    if rows * cols == tp:
        return None
    return _violation("PAR0274", ("parallel.tp_shape", "parallel.tp"),
                      f"tp_shape = ({rows}, {cols}) arranges {rows}·{cols} = {rows * cols} ranks, but tp = {tp}",
                      f"write tp_shape = (1, {tp}), or a pair whose product is {tp}")





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



@rule("PAR0228", BUILD)
def build_tp_2d_qk_norm(tp_shape, qk_norm):
    """A 2D grid repeats a row's heads on its R ranks; the head norms' gradient sum over tp
    (``llama_attention.HeadNorm``) is 1D's, so ``qk_norm`` is built with 1D tensor parallelism only."""
    if not tp_2d(tp_shape) or not qk_norm:
        return None
    rows, cols = tp_shape
    return _violation("PAR0228", ("model.qk_norm", "parallel.tp_shape"),
                      f"model.qk_norm = true is not built with 2D tensor parallelism (tp_shape = ({rows}, {cols}))",
                      f"write tp_shape = (1, {rows * cols}), or remove model.qk_norm")
