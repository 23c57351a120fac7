"""Training: warmup, token ids, ZeRO's sharding and the pipeline's gradient codec."""

from __future__ import annotations

from ..rule_engine import DERIVED, _violation, rule
from ..rule_keys import declare, derive

declare(  # Note [a feature declares its values]: ZeRO-3's options, the pipeline codec's
    zero_prefetch="parallel.zero_prefetch", zero_shard="parallel.zero_shard",
    compress_pp="parallel.compress_pp", compress_stages="parallel.compress_stages",
)


@derive()  # Note [a derived value]: per-layer tp/dp's PAR0254 (rules_hetero.py) reads it
def per_layer_zero(zero=None, zero_shard=None) -> tuple[str, str, str] | None:
    """Why a per-layer layout is not built with this ZeRO, as (blamed key, what the spec asks,
    what to write instead); None when it is (ZeRO-1/2: hetero.ShardedAdamW; 3: fsdp over each
    layer's dp group; not HSDP's node groups yet)."""
    if zero == 3 and zero_shard == "node":
        return ("parallel.zero_shard", "zero = 3 and zero_shard = node",
                "use zero_shard = dp (each layer's units shard over its own dp group)")
    return None


@derive()  # Note [a derived value]: per-layer tp/dp's PAR0254 (rules_hetero.py) reads it
def per_layer_codec(compress=None, compress_pp=None) -> tuple[str, str, str] | None:
    """As ``per_layer_zero``, for gradient compression (dp's, then the pipeline's; None: auto,
    which may pick one): per-layer layouts keep fp32 gradients, uncompressed."""
    if compress == "none" and compress_pp == "none":
        return None
    key, value = ("compress", compress) if compress != "none" else ("compress_pp", compress_pp)
    return (f"parallel.{key}", f"{key} = {value or 'auto'}", f"set {key} = none")


@rule("PAR0213")
def warmup_within_steps(warmup, steps, decay=None):
    """Warmup (and ``wsd``'s decay after it) fit in the run: ``warmup + decay <= steps``."""
    if decay is None:
        if warmup <= steps:
            return None
        return _violation("PAR0213", ("train.schedule.warmup", "train.schedule"),
                          f"warmup = {warmup} is more than steps = {steps}", f"warmup is counted in steps: at most {steps}")
    if warmup + decay <= steps:
        return None
    return _violation("PAR0213", ("train.schedule.decay", "train.schedule"),
                      f"warmup + decay = {warmup} + {decay} = {warmup + decay} is more than steps = {steps}",
                      f"the decay is the run's last steps, after the warmup: decay at most {max(steps - warmup, 0)}"
                      f" with warmup = {warmup}")



TOKEN_IDS = {"uint16": 2**16, "uint32": 2**32}



@rule("PAR0214")
def vocab_fits_tokens(data, vocab, data_dtype=None):
    dtype = data_dtype or "uint16"
    if data != "tokens" or dtype != "uint16" or vocab <= TOKEN_IDS[dtype]:
        return None
    return _violation("PAR0214", ("train.data.dtype", "train.data"),
                      f"vocab = {vocab} does not fit the token file's dtype uint16 (at most 65536 ids)",
                      'write tokens("...", dtype = uint32)')



@rule("PAR0216")
def blend_weights_per_file(data, data_files=None, data_weights=None, data_val_files=None):
    """A blend (``tokens([...], weights = [...])``) has one weight per token file and, with
    ``val``, one validation file or one per token file."""
    if data != "tokens" or data_files is None:
        return None
    if data_weights is not None and data_weights != data_files:
        files = "one file" if data_files == 1 else f"{data_files} files"
        return _violation("PAR0216", ("train.data",),
                          f"tokens(...) has {files} but {data_weights} weight{'s' * (data_weights != 1)}",
                          "give one weight per file, in the order of the files (tokens([\"a.bin\", \"b.bin\"], "
                          "weights = [0.3, 0.7])), or leave weights out for equal shares")
    if data_val_files is not None and data_val_files not in (1, data_files):
        return _violation("PAR0216", ("train.data",),
                          f"tokens(...) reads {data_files} file{'s' * (data_files != 1)} but names "
                          f"{data_val_files} validation files",
                          "name one validation file, or one per file of the blend (blended by the same "
                          "weights), or leave val out to hold out each file's last tenth")
    return None


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
def zero_needs_data_ranks(zero, dp, cp=None, tp=None, layer_dp=None, ep=None, expert_fold=None):
    """ZeRO shards over the data-parallel ranks (dp·cp; a per-layer dp list: its largest
    degree); expert-parallel parameters over their edp = dp·cp·tp / ``expert_fold`` ranks (Note
    [experts under ZeRO] in zero.py, Note [a derived value]). With one such rank it shards
    nothing: as ``sp = true`` with tp = 1 (PAR0209), a setting that does nothing is refused."""
    ranks = max(layer_dp or (dp,)) * (cp or 1)
    expert_ranks = ranks * (tp or 1) // expert_fold if (ep or 1) > 1 else ranks
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
def zero_shard_node_experts(zero, zero_shard, devices_per_node, tp, dp, ep, expert_fold, cp=None):
    """HSDP with ``expert_fold`` = F > 1 (Note [a derived value]) shards each MoE block's experts
    over the edp ranks of one node (fsdp.py, Note [experts as units]): a stage's S = dp·cp·tp
    ranks fold as edp·F, an edp group every F-th of them, so it splits evenly over nodes when
    a node holds whole stages, or when F divides devices_per_node or devices_per_node divides F."""
    folds, written = expert_fold, DERIVED["expert_fold"].written
    if zero != 3 or zero_shard != "node" or folds == 1:
        return None
    stage = dp * (cp or 1) * tp
    if devices_per_node % stage == 0 or devices_per_node % folds == 0 or folds % devices_per_node == 0:
        return None
    return _violation("PAR0813", ("parallel.zero_shard", "parallel.ep"),
                      f"zero_shard = node shards the experts over the edp ranks of one node, but {written} = {folds} "
                      f"neither divides nor is a multiple of devices_per_node = {devices_per_node}: the edp ranks "
                      "do not split evenly over nodes",
                      f"use an {written} that divides devices_per_node (or a multiple of it), or zero_shard = dp")


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
