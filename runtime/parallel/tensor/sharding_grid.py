"""The tensor transform under 2D tensor parallelism (Note [2D tensor parallelism] in
layers2d.py): ``sharding.shard`` builds each layer through a ``GridBuilder`` when it has
a grid. Only a 2D build ships this module (features.py's "2D tensor parallel").

Takes: the checked plan, the tp group, whether sequence parallelism is on, the grid
(``Mesh.tp_grid``) and the model's config. Gives: ``Grid``, the part of the builder
(``sharding._Builder``, which ``sharding`` puts under it: this module imports nothing of
sharding.py's) whose norms, linears, embedding and head are layers2d.py's; it refuses a
plan that leaves a layer whole.
"""

from __future__ import annotations

from ...layout.model_desc import describe
from .layers2d import Embedding2D, Linear2D, Norm2D, Positions2D


class Grid:
    """``sharding._Builder``'s choices on a 2D grid: every layer the plan splits is layers2d.py's."""

    def __init__(self, plan, tp_group, sequence_parallel, *, grid, config):
        super().__init__(plan, tp_group, sequence_parallel)
        self.grid = grid
        # the hidden state is split over R: no layer may stay whole
        whole = [m.name for m in describe(config).modules if m.style and plan.style(m.name) is None]
        if whole:
            raise ValueError(f"tp plan: 2D tensor parallelism (TP_SHAPE) splits every layer, but "
                             f"{', '.join(whole[:3])} {'is' if len(whole) == 1 else 'are'} replicated")

    def norm(self, norm):
        """A ``Norm2D`` for the norm."""
        return Norm2D(norm.weight.shape[0], rms=norm.rms, eps=norm.eps, grid=self.grid, sequence_parallel=self.sp)

    def linear(self, name, plain, head_rows=None):
        style = self.plan.style(name)
        if style not in ("colwise", "rowwise"):
            return plain  # a module tp never splits (a MoE router)
        return Linear2D(plain.in_features, plain.out_features, bias=plain.bias is not None, grid=self.grid,
                        style=style, sequence_parallel=self.sp)

    def embedding(self, model):
        config = model.config
        model.embed = Embedding2D(config.padded_vocab, config.hidden, grid=self.grid, sequence_parallel=self.sp)
        if config.arch == "gpt":
            model.pos_embed = Positions2D(config.seq_len, config.hidden, grid=self.grid, sequence_parallel=self.sp)

    def head(self, model):
        """Column-parallel: logits (B, T, V/C)."""
        model.head = Linear2D(model.config.hidden, model.config.padded_vocab, bias=False, grid=self.grid,
                              style="colwise", sequence_parallel=self.sp)
