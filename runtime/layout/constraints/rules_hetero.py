"""Heterogeneous per-layer tp × dp (runtime/parallel/data/hetero.py), and master weights."""

from __future__ import annotations


from ..rule_engine import BUILD, _violation, divisors, entries, per_layer, rule


def layer_degrees(values: dict) -> dict:
    """Note [heterogeneous layouts]: ``tp``/``dp`` written as lists become the coarse split
    (the largest tp, the fewest dp: the mesh's and the batch formula's) and the lists
    ``layer_tp``/``layer_dp``; a list holding ``auto`` is unknown. Changes ``values`` in place."""
    for name, pick in (("tp", max), ("dp", min)):
        value = values.get(name)
        if isinstance(value, (list, tuple)):
            known = None not in value and "auto" not in value
            values[f"layer_{name}"] = tuple(value) if known else None
            values[name] = pick(value) if known else None
        else:
            values[f"layer_{name}"] = None
    return values


@rule("PAR0250")
def hetero_lengths(layers, layer_tp=None, layer_dp=None):
    """A per-layer ``tp`` or ``dp`` lists one degree per transformer block."""
    for key, value in (("tp", layer_tp), ("dp", layer_dp)):
        if value is not None and len(value) != layers:
            return _violation("PAR0250", f"parallel.{key}",
                              f"`parallel.{key}` lists {len(value)} degree{'s' if len(value) != 1 else ''} "
                              f"but the model has layers = {layers}",
                              f"give one {key} per layer ({layers}), or one degree for all of them")
    return None


@rule("PAR0251")
def hetero_products(layers, tp, dp, layer_tp=None, layer_dp=None):
    """dp[i] · tp[i] is the same for every layer: each layer splits the same ranks."""
    if layer_tp is None and layer_dp is None:
        return None
    tps = layer_tp or (tp,) * layers
    dps = layer_dp or (dp,) * layers
    if len(tps) != layers or len(dps) != layers:
        return None  # PAR0250
    products = [d * t for d, t in zip(dps, tps)]
    if len(set(products)) == 1:
        return None
    i = next(i for i, p in enumerate(products) if p != products[0])
    given = "tp" if layer_tp is not None and layer_dp is None else "dp"
    ranks = products[0]
    hint = ("give `dp` one value per layer too, dp[i] = " + f"{ranks} / tp[i]: "
            + "[" + ", ".join(str(ranks // t) if ranks % t == 0 else "?" for t in tps) + "]"
            if layer_dp is None else "each layer splits its stage's ranks: make dp[i]·tp[i] the same for all")
    return _violation("PAR0251", (f"parallel.{given}", "parallel.tp"),
                      f"every layer must split the same ranks: dp[0]·tp[0] = {dps[0]}·{tps[0]} = {products[0]} "
                      f"but dp[{i}]·tp[{i}] = {dps[i]}·{tps[i]} = {products[i]}", hint)


@rule("PAR0252")
def hetero_degrees_divide(layer_tp):
    """Neighbouring degrees divide one another: a change of degree splits or gathers the batch."""
    degrees = sorted(set(layer_tp))  # each pair once: a 96-layer list has few degrees
    for t in degrees:
        for u in degrees:
            if max(t, u) % min(t, u):
                return _violation("PAR0252", "parallel.tp",
                                  f"tp degrees {t} and {u} in one stage do not divide one another",
                                  "use degrees that divide each other (powers of two): the batch moves "
                                  "between layers by splits and gathers")
    return None


@rule("PAR0253")
def hetero_micro_batch(layer_tp, tp, micro_batch):
    """A layer at tp / k splits each coarse micro-batch into k pieces along the batch."""
    k = tp // min(layer_tp)
    if micro_batch % k == 0:
        return None
    return _violation("PAR0253", ("train.micro_batch", "parallel.tp"),
                      f"micro_batch = {micro_batch} does not split into tp / min(tp) = {tp} / {min(layer_tp)} = {k} "
                      "pieces (a layer with fewer tp ranks has more dp ranks, each with a piece of the micro-batch)",
                      f"make micro_batch a multiple of {k}")


def _hetero_unbuilt(layer_tp, layer_dp, pp, cp, experts, auto, schedule, per_layer_zero=None):
    reason = None
    if auto:
        reason = (f"parallel.{auto[0]}" if auto[0] != "micro_batch" else "train.micro_batch", f"{auto[0]} = auto",
                  f"give {auto[0]} a value (with tp and dp lists written the planner fills only zero and "
                  "recompute; write tp = auto and dp = auto for it to search per-layer degrees)")
    elif pp is not None and pp > 1 and schedule not in (None, "1f1b", "gpipe"):
        reason = ("parallel.schedule", f"pp = {pp} and schedule = {schedule}", "use schedule = 1f1b or gpipe")
    elif cp is not None and cp > 1:
        reason = ("parallel.cp", f"cp = {cp}", "set cp = 1")
    elif per_layer_zero is not None:
        reason = per_layer_zero
    elif experts:
        reason = ("model.experts", "experts (MoE)", "use a dense model (experts = 0)")
    if reason is None:
        return None
    return _refused(*reason)


def _refused(key: str, what: str, hint: str):
    return _violation("PAR0254", (key, "parallel.tp"), f"per-layer tp/dp with {what} is not supported yet by parc build",
                      f"{hint}, or give tp and dp one value for all layers")


@rule("PAR0254", BUILD)
def hetero_unbuilt(layer_tp, layer_dp=None, pp=None, cp=None, experts=None, overlap=None, sp=None,
                   micro_batch=None, schedule=None, per_layer_zero=None, per_layer_codec=None):
    """What a heterogeneous layout cannot be combined with yet (Note [heterogeneous layouts]),
    ``auto`` values included: the planner would fill them for the coarse split alone. ZeRO's
    and the gradient codecs' refusals are theirs (``per_layer_zero``, ``per_layer_codec`` in
    rules_training.py, Note [a derived value])."""
    # None: auto (these have a default or are required; an unwritten zero or recompute is None too)
    values = dict(pp=pp, sp=sp, micro_batch=micro_batch, overlap=overlap)
    auto = [name for name, value in values.items() if value is None or None in entries(value)]
    reason = _hetero_unbuilt(layer_tp, layer_dp, pp, cp, experts, auto, schedule, per_layer_zero)
    if reason is None and per_layer_codec is not None:
        reason = _refused(*per_layer_codec)
    return reason


@rule("PAR0255", BUILD)
def hetero_stage_boundaries(layer_tp, layers, pp, stage_layers=None, tie_embeddings=None):
    """Under a pipeline, activations cross every stage boundary at one degree (the executor's
    one activation shape), and a tied head shares the embedding's sharding."""
    if pp == 1:
        return None
    sizes = stage_layers or ((layers // pp,) * pp if layers % pp == 0 else None)
    if sizes is None or len(sizes) != pp or sum(sizes) != layers or len(layer_tp) != layers:
        return None  # PAR0205 / PAR0206 / PAR0250
    starts = [sum(sizes[:i]) for i in range(1, pp)]
    crossing = {(layer_tp[s - 1], layer_tp[s]) for s in starts}
    if len(crossing) == 1 and len(set(next(iter(crossing)))) == 1:
        if tie_embeddings is False or layer_tp[0] == layer_tp[-1]:
            return None
        return _violation("PAR0255", ("parallel.tp", "parallel.pp"),
                          f"with tied embeddings over a pipeline the first and last layers share the table's "
                          f"sharding, but tp[0] = {layer_tp[0]} and tp[{layers - 1}] = {layer_tp[-1]}",
                          "give the first and last layer the same tp")
    pairs = ", ".join(f"tp[{s - 1}] = {layer_tp[s - 1]} → tp[{s}] = {layer_tp[s]}" for s in starts)
    return _violation("PAR0255", ("parallel.tp", "parallel.pp"),
                      f"per-layer tp across pipeline stages is built only where every stage boundary has one "
                      f"degree on both sides: {pairs}",
                      "give the layers on both sides of each boundary the same tp (one for all boundaries)")


def master_weights(precision: str, *, per_layer_tp: bool, compressed: bool) -> bool:
    """Whether ``train.precision`` bf16/fp16 holds the parameters in that dtype with fp32
    master weights in the optimizer (runtime/optimizers/master.py, Note [master weights]). Per-layer
    tp/dp layouts and compressed gradients (dp or pipeline) keep fp32 parameters and
    autocast the forward over them: their gradient code has no low-precision weights
    yet. The renderer and the planner's memory model both ask here."""
    return precision in ("bf16", "fp16") and not per_layer_tp and not compressed
