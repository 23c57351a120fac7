"""The tensor transform and the parameter check under per-layer layouts (Note
[heterogeneous layouts] in hetero.py): each block, the embedding and the head at their own
tp degree.

Takes: a stage sharded by ``sharding.shard`` under ``hetero.StageLayouts``. Gives:
``tag_layouts`` (each parameter's ``layer_tp``, and the stage made a ``Layered`` one) and
``Layered`` (the forward that reshards between layouts, and ``expected_params``: the
parameters ``transformer.check_parameter_count`` expects of the stage). Only a build
with per-layer layouts ships this module.
"""

from __future__ import annotations

import functools

from ...layout.roles import assign
from ...models.residual import settle


class Layered:
    """A ``Transformer`` (or pipeline ``Stage``) whose blocks, embedding and head each have
    their own tp degree: ``tag_layouts`` makes a sharded stage one, its class becoming
    ``Layered`` and its own (``layered``; as torch's ``fully_shard`` changes a module's
    class). Tokens come in the coarse layout and are split into the embedding's; the
    stream is resharded whole into each block's layout, then into the head's, whose loss
    goes back to the coarse layout (Note [heterogeneous layouts])."""

    def forward(self, x, targets=None, documents=None):
        self._current_tp = self.embed_tp if self.first else self.block_tp[min(self.block_tp)]
        if self.first:
            x = self.layouts.split_inputs(x, self.embed_tp)
        return super().forward(x, targets, documents)

    def enter(self, x, delta, layer):
        """The stream resharded whole into block ``layer``'s layout (the delta settled)."""
        return self.reshard(settle(x, delta), layer), None

    def reshard(self, x, layer=None):
        """Activations into ``layer``'s layout (the head's when None), from the previous one's."""
        t = self.head_tp if layer is None else self.block_tp[int(layer.index)]
        x = self.layouts.reshard(x, self._current_tp, t, sequence_parallel=self.sp)
        self._current_tp = t
        return x

    def loss(self, x, targets, delta=None):
        """The head's loss in its layout, back in the coarse one."""
        x = self.reshard(settle(x, delta))
        loss = super().loss(x, self.layouts.split_inputs(targets, self.head_tp))
        return self.layouts.coarse_loss(loss, self.head_tp)

    def expected_params(self, desc, ep):
        """What model_desc.py describes for this stage: each block, the embedding and the
        head at their own degree."""
        start = self.span[0]
        styles = self._styles
        parts = [desc.stage_params(t, layers=(i, i + 1), first=False, last=False, sharded=styles[t], ep=ep)
                 for i, t in self.block_tp.items()]
        e, h = self.embed_tp, self.head_tp
        if e == h:
            parts.append(desc.stage_params(e, layers=(start, start), first=self.first, last=self.last,
                                           sharded=styles[e]))
        else:
            parts.append(desc.stage_params(e, layers=(start, start), first=self.first, last=False, sharded=styles[e]))
            parts.append(desc.stage_params(h, layers=(start, start), first=False, last=self.last, sharded=styles[h]))
        return type(parts[0])(elements=sum(p.elements for p in parts), tensors=sum(p.tensors for p in parts))


@functools.cache
def layered(cls):
    """``Layered`` over the class ``cls`` of a stage (``Transformer`` or ``Stage``)."""
    return cls if issubclass(cls, Layered) else type(f"Layered{cls.__name__}", (Layered, cls), {})


def tag_layouts(model):
    """Each parameter's ``layer_tp``: the degree of the layer it belongs to (hetero.py); the
    stage becomes ``Layered``."""
    model.__class__ = layered(type(model))
    for name, p in model.named_parameters():
        if name.startswith("layers."):
            assign(p, layer_tp=model.block_tp[int(name.split(".")[1])])
        elif name.startswith(("embed.", "pos_embed.")):
            assign(p, layer_tp=model.embed_tp)
        else:  # final_norm, head
            assign(p, layer_tp=model.head_tp)
