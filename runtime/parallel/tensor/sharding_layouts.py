"""The tensor transform and the parameter check under per-layer layouts (Note
[heterogeneous layouts] in hetero.py): each block, the embedding and the head at their own
tp degree.

Takes: a stage sharded by ``sharding.shard`` under ``hetero.StageLayouts``. Gives:
``tag_layouts`` (each parameter's ``layer_tp``) and ``expected_params`` (the parameters
``transformer.check_parameter_count`` expects of the stage). Only a build with per-layer
layouts ships this module.
"""

from __future__ import annotations

from ...layout.roles import assign


def tag_layouts(model):
    """Each parameter's ``layer_tp``: the degree of the layer it belongs to (hetero.py)."""
    for name, p in model.named_parameters():
        if name.startswith("layers."):
            assign(p, layer_tp=model.block_tp[int(name.split(".")[1])])
        elif name.startswith(("embed.", "pos_embed.")):
            assign(p, layer_tp=model.embed_tp)
        else:  # final_norm, head
            assign(p, layer_tp=model.head_tp)


def expected_params(model, desc, ep):
    """What model_desc.py describes for this stage: each block, the embedding and the
    head at their own degree."""
    start = model.span[0]
    styles = model._styles
    parts = [desc.stage_params(t, layers=(i, i + 1), first=False, last=False, sharded=styles[t], ep=ep)
             for i, t in model.block_tp.items()]
    e, h = model.embed_tp, model.head_tp
    if e == h:
        parts.append(desc.stage_params(e, layers=(start, start), first=model.first, last=model.last,
                                       sharded=styles[e]))
    else:
        parts.append(desc.stage_params(e, layers=(start, start), first=model.first, last=False, sharded=styles[e]))
        parts.append(desc.stage_params(h, layers=(start, start), first=False, last=model.last, sharded=styles[h]))
    return type(parts[0])(elements=sum(p.elements for p in parts), tensors=sum(p.tensors for p in parts))
