"""The tensor-parallel plan of train.py: which module is split how over tp, checked.

Takes: the literal ``TP_PLAN`` table (module-name pattern → style, ``*`` standing
for the layer index), the model config, the tp group and whether sequence
parallelism is on (and, under 2D tensor parallelism, the grid). Gives: ``TensorParallelPlan.style(name)``, the style of each
module (None: replicated), for ``model.py`` to build its layers from. Every problem
with a table is a ValueError naming the pattern or module, raised before any layer
is built: an unknown style, a pattern that matches no module, a style a module
cannot take, an attention or MLP half-sharded, sizes tp (on a 2D grid, C) does not divide.
"""

from __future__ import annotations

import re

from ...distributed.comm import group_size
from ...layout.model_rules import kv_replicas
from ...layout.model_desc import describe

STYLES = ("colwise", "rowwise", "vocab", "vocab_head")


def module_names(config) -> list[str]:
    """Every module a plan may name, in model order (model_desc.py, as model.py builds them)."""
    return [m.name for m in describe(config).modules]


def _kind(name: str) -> str:
    """``layers.3.attn.q_proj`` → ``attn.q_proj``; other names are their own kind."""
    return re.sub(r"^layers\.[0-9]+\.", "", name)


def _compile(pattern: str) -> re.Pattern:
    return re.compile("[0-9]+".join(re.escape(part) for part in pattern.split("*")))


class TensorParallelPlan:
    def __init__(self, table, config, *, tp_group, sequence_parallel, grid=None):
        """``grid``: the ``layers2d.TensorGrid`` under 2D tensor parallelism, whose C ranks of
        a row split what tp splits in 1D (Note [2D tensor parallelism]); None: 1D."""
        self.tp = group_size(tp_group)
        self.grid = grid
        table = dict(table or {})
        for pattern, style in table.items():
            if style not in STYLES:
                raise ValueError(
                    f"tp plan: {pattern!r} has unknown style {style!r}; styles are {', '.join(STYLES)}"
                )
        compiled = {pattern: _compile(pattern) for pattern in table}
        self.styles, used = {}, set()
        for name in module_names(config):
            matches = [p for p, regex in compiled.items() if regex.fullmatch(name)]
            used.update(matches)
            styles = sorted({table[p] for p in matches})
            if len(styles) > 1:
                raise ValueError(f"tp plan: {name} is matched by {matches} with different styles {styles}")
            if styles:
                self.styles[name] = styles[0]
        unused = [p for p in table if p not in used]
        if unused:
            raise ValueError(f"tp plan: pattern(s) {unused} match no module of this {config.arch} model")
        desc = describe(config)
        for name, style in self.styles.items():
            wanted = desc.module(name).style  # the Megatron pairing (model_desc.py)
            if wanted is None:
                raise ValueError(f"tp plan: {name} is replicated; it cannot be {style!r}")
            if style != wanted:
                raise ValueError(f"tp plan: {name} can only be {wanted!r}, not {style!r}")
        self._check_pairs(config, sequence_parallel)
        self._check_sizes(config)
        if self.tp == 1:
            self.styles = {}  # one rank: plain layers (the table was still checked)

    def style(self, name: str) -> str | None:
        """How module ``name`` is split over tp; None when it is replicated."""
        return self.styles.get(name)

    def _check_pairs(self, config, sequence_parallel) -> None:
        for block in describe(config).blocks:
            i = block.index
            for part in ("attn", "mlp"):  # each a column-parallel → row-parallel pair (model_desc.py)
                linears = [m for m in block.modules if m.style and m.kind.startswith(part + ".")]
                names = [m.name for m in linears]
                projections = [m.kind.split(".", 1)[1] for m in linears]
                sharded = [n for n in names if n in self.styles]
                if sharded and len(sharded) != len(names):
                    raise ValueError(
                        f"tp plan: layers.{i}.{part} is half sharded ({', '.join(sharded)}); "
                        f"shard all of {', '.join(projections)} or none"
                    )
                # a MoE block's routed experts have no pair: they route the shard (moe.py)
                if sequence_parallel and self.tp > 1 and names and not sharded:
                    raise ValueError(
                        f"tp plan: with sequence parallelism layers.{i}.{part} must be sharded "
                        "(its input is a sequence shard)"
                    )
        if config.tie_embeddings and ("embed" in self.styles) != ("head" in self.styles):
            raise ValueError("tp plan: a tied head and embedding must both be vocab-parallel or neither")

    def _check_sizes(self, config) -> None:
        """The sizes each sharded module splits: over tp, or on a 2D grid over C (its hidden
        features over R: ``layers2d``'s own check), which never replicates kv heads."""
        split, who = (self.tp, "tp") if self.grid is None else (self.grid.cols, "C of the 2D grid")
        replicas = kv_replicas(config.kv_heads, split) if self.grid is None else int(config.kv_heads % split == 0)
        if "attn.k_proj" in {_kind(name) for name in self.styles} and not replicas:
            raise ValueError(f"tp plan: {who} = {split} neither divides kv_heads = {config.kv_heads} nor is a "
                             "multiple of it (attn.k_proj)")
        sizes = {
            "attn.q_proj": ("heads", config.heads),
            "attn.k_proj": ("kv_heads·head_dim", config.kv_heads * config.head_dim),
            "mlp.up_proj": ("ffn", config.ffn),
            "embed": ("padded_vocab", config.padded_vocab),
            "head": ("padded_vocab", config.padded_vocab),
        }
        for name in self.styles:
            what, value = sizes.get(_kind(name), (None, 0))
            if what and value % split:
                raise ValueError(f"tp plan: {who} = {split} does not divide {what} = {value} ({name})")
