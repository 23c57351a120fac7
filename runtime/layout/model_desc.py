"""One description of the model: its modules, shapes, parameter counts, FLOPs.

Takes: a ``ModelConfig``. Gives: ``describe(config)`` → ``ModelDesc``: every module in
model order as ``model.py`` names it (``layers.3.attn.q_proj``), with its parameters'
full shapes and the dim tp splits; the parameters of the model, of a block, of a
pipeline stage on one tp rank, and those whose gradients are partial under sequence
parallelism; model FLOPs per token. What a block saves for backward is the planner's,
from a block's description (saved_elements.py, which a build does not ship).

Pure Python, no torch: the code generator reads it as ``parc.runtime.layout.model_desc``
(settle_training's count in train.py's docstring, partition_layers' TP table, the
cost model) and the trainer as ``parc_runtime.model_desc`` (``model.py`` checks the
model it built against it, ``metrics.py`` counts FLOPs with it). ``runtime/models/model.py``
re-exports ``ModelConfig``.

Each block has a ``BlockDesc`` of its own (``ModelDesc.blocks``), so blocks may
differ: a mixture-of-experts block lists its experts' modules (expert_desc.py, shipped
with experts) and carries its expert count there, and every count follows. Build
descriptions with ``describe``. The planner's counts (parc's TP table, the 2D grid,
the whole model's parameters and the active ones, sp's partial gradients, the typical
block) live in model_counts.py, memoized per (config, tp): the planner asks thousands of
times and calls it (or the methods here that import it when called), so a build, whose trainer
only checks the model it built (``stage_params(sharded=...)``), does not ship it. The parts (``ParamDesc``,
``ModuleDesc``, ``ParamCount``) are model_parts.py's, given here too: those two modules
import them from there, never this one back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from . import model_rules  # noqa: F401 - registers the model-shape rules that violations() runs here
# the parts (model_parts.py) are this module's API too: the planner reads LINEAR, NONE, ParamCount here
from .model_parts import EMBEDDING, GROUPED, LINEAR, NONE, NORM, ModuleDesc, ParamCount, ParamDesc  # noqa: F401
from .rule_engine import violations

ARCHS = ("gpt", "llama")
ROUTERS = ("softmax", "sigmoid")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    padded_vocab: int
    seq_len: int
    dropout: float = 0.0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    experts: int = 0
    """Routed experts of each MoE block; 0: a dense model (runtime/parallel/expert/moe.py)."""
    top_k: int = 2
    expert_ffn: int | None = None
    """Hidden size of each expert (None: ``ffn``); read it as ``expert_hidden``."""
    moe_every: int = 1
    first_dense_layers: int = 0
    """The first k blocks are dense (DeepSeek's ``first_k_dense_replace``): ``is_moe``."""
    shared_experts: int = 0
    router: str = "softmax"
    capacity_factor: float | None = None
    """None: dropless."""
    aux_loss: float = 0.01
    z_loss: float = 0.0
    aux_loss_scope: str = "micro_batch"
    """``sequence``: the balance loss per sequence, averaged (DeepSeek-V3's sequence-wise loss)."""
    router_bias_update: float = 0.0
    """Auxiliary-loss-free balancing's rate (runtime/parallel/expert/balance.py); 0: off."""
    documents: str = "joined"
    """``separate``: attention and positions stay inside each document of a sequence
    (runtime/models/documents.py); ``joined``: they cross documents."""
    head_dim: int | None = None
    """Features of each attention head; None: hidden / heads (filled in at construction, so
    it is always an int once built: ``_settle_head_dim``). Qwen3: 128 on hidden 4096, 64 heads."""
    qk_norm: bool = False
    """RMSNorm over head_dim on each head of q and k before rotary (Qwen3, OLMo-2; llama)."""
    attention_bias: bool = False
    """Biases on q, k, v (not o), as Qwen2 (llama; gpt has every bias anyway)."""

    def __post_init__(self):
        written = self.head_dim  # None: the default, which PAR0202 (heads divide hidden) holds
        _settle_head_dim(self)
        if self.arch not in ARCHS:
            raise ValueError(f"ModelConfig: arch must be 'gpt' or 'llama', not {self.arch!r}")
        if self.documents not in ("joined", "separate"):
            raise ValueError(f"ModelConfig: documents must be 'joined' or 'separate', not {self.documents!r}")
        if self.aux_loss_scope not in ("micro_batch", "sequence"):
            raise ValueError(f"ModelConfig: aux_loss_scope must be 'micro_batch' or 'sequence', not {self.aux_loss_scope!r}")
        if self.router not in ROUTERS:
            raise ValueError(f"ModelConfig: router must be one of {ROUTERS}, not {self.router!r}")
        shape = {"hidden": self.hidden, "heads": self.heads, "kv_heads": self.kv_heads,
                 "experts": self.experts, "top_k": self.top_k, "layers": self.layers,
                 "first_dense_layers": self.first_dense_layers, "head_dim": written, "arch": self.arch,
                 "qk_norm": self.qk_norm, "attention_bias": self.attention_bias}
        for violation in violations(shape):  # the rules parc check applies (model_rules.py)
            raise ValueError(f"ModelConfig: {violation.message}")
        if self.padded_vocab < self.vocab:
            raise ValueError(f"ModelConfig: padded_vocab = {self.padded_vocab} < vocab = {self.vocab}")

    @property
    def attention_width(self) -> int:
        """heads · head_dim: q_proj's output features and o_proj's input ones."""
        return self.heads * self.head_dim

    @property
    def expert_hidden(self) -> int:
        return self.ffn if self.expert_ffn is None else self.expert_ffn

    def is_moe(self, index: int) -> bool:
        """Whether block ``index`` is a mixture of experts: every ``moe_every``-th block
        (Megatron's ``moe_layer_freq``) past the ``first_dense_layers`` dense ones, as
        Hugging Face's DeepSeek-V3 (``i >= first_k_dense_replace and i % moe_layer_freq == 0``)."""
        return self.experts > 0 and index >= self.first_dense_layers and index % self.moe_every == 0


def _settle_head_dim(config: ModelConfig) -> None:
    """The default head_dim, hidden / heads, written into the (frozen) record once."""
    if config.head_dim is None and config.heads:
        object.__setattr__(config, "head_dim", config.hidden // config.heads)


# ---- the description ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockDesc:
    """One transformer block (``layers.{index}``): attention, then the MLP."""

    index: int
    modules: tuple[ModuleDesc, ...]
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    experts: int = 0
    """Routed experts of this block (0: a dense MLP)."""
    top_k: int = 0

    def matmul_weights(self, part: str | None = None) -> int:
        """Elements of the weights a token meets in a matmul (no biases, no norms), of the
        whole block or of one ``part`` (``attn``, ``mlp``): of the experts, the top_k a
        token is routed to."""
        total = 0
        for m in self.modules:
            if part is not None and not m.kind.startswith(part + "."):
                continue
            if m.layer == LINEAR:
                total += m.weight.numel()
            elif m.layer == GROUPED:
                total += m.weight.numel() // self.experts * self.top_k
        return total

    def core_flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs of the attention core per token: q·kᵀ and (·)v over ``seq_len``
        positions, 2·2·H·Q·T (causal masking not discounted)."""
        return 4.0 * self.heads * self.head_dim * seq_len

    def flops_per_token(self, seq_len: int) -> float:
        """PaLM's training FLOPs: 6 per matmul weight, three times the attention core
        (12·H·Q·T): forward, and backward twice it."""
        return 6.0 * self.matmul_weights() + 3.0 * self.core_flops_per_token(seq_len)


def _count(modules, tp: int, sharded) -> ParamCount:
    """Parameters of ``modules`` on one rank, the modules named in ``sharded`` split over ``tp``."""
    elements = sum(module.numel(tp if module.name in sharded else 1) for module in modules)
    return ParamCount(elements=elements, tensors=sum(len(module.params) for module in modules))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelDesc:
    """The model in model order: ``embed`` (first stage), ``blocks``, ``head`` (last stage)."""

    config: ModelConfig
    embed: tuple[ModuleDesc, ...]
    """``embed`` and, for gpt, ``pos_embed``."""
    blocks: tuple[BlockDesc, ...]
    head: tuple[ModuleDesc, ...]
    """``final_norm`` and ``head`` (whose weight is ``embed``'s when tied, on one stage)."""

    @property
    def modules(self) -> tuple[ModuleDesc, ...]:
        return self.embed + tuple(m for b in self.blocks for m in b.modules) + self.head

    def module(self, name: str) -> ModuleDesc:
        """The module called ``name``; KeyError for a name the model does not have."""
        return _by_name(self.config)[name]

    def has_head_weight(self, *, first: bool) -> bool:
        """Whether a last stage holds a head matrix: untied, or not also the first stage
        (runtime/models/pipeline_stages.py, Note [tied embeddings across stages])."""
        return not self.config.tie_embeddings or not first

    def stage_params(
        self, tp: int = 1, *, layers: tuple[int, int] | None = None, first: bool = True, last: bool = True,
        sharded=None, ep: int = 1, grid=None,
    ) -> ParamCount:
        """Parameters of one tp rank of a pipeline stage holding blocks ``layers = (start,
        stop)`` (all by default), the embedding when ``first``, the final norm and head
        when ``last``. ``sharded``: the module names tp splits, when not parc's table;
        ``ep``: how many ways each MoE block's grouped expert weights are split (the product of the
        expert layers' degrees, expert_folding.py's Note [parallel folding]: a rank holds 1 / ep);
        ``grid``: (R, C) under 2D tensor parallelism with R > 1 (dense models only)."""
        start, stop = (0, len(self.blocks)) if layers is None else layers
        if ep > 1 and grid is None:  # each rank holds 1 / ep of every MoE block's grouped expert weights
            whole = self.stage_params(tp, layers=(start, stop), first=first, last=last, sharded=sharded)
            grouped = sum(m.numel() for b in self.blocks[start:stop] for m in b.modules if m.layer == GROUPED)
            return ParamCount(elements=whole.elements - grouped + grouped // ep, tensors=whole.tensors)
        if sharded is not None and grid is None:  # the trainer's check of the model it built
            return _count(self._stage_modules(start, stop, first, last), tp, frozenset(sharded))
        from . import model_counts  # the planner's: parc's TP table, the 2D grid; a build does not ship it

        return model_counts.counted_stage(self, tp, start, stop, first, last, grid)

    def _stage_modules(self, start: int, stop: int, first: bool, last: bool) -> tuple[ModuleDesc, ...]:
        """The modules of a stage of blocks [start, stop), the embedding when ``first``, the
        final norm and a head matrix of its own (``has_head_weight``) when ``last``."""
        modules = (self.embed if first else ()) + tuple(m for b in self.blocks[start:stop] for m in b.modules)
        if last:
            modules += self.head if self.has_head_weight(first=first) else self.head[:-1]
        return modules

    def flops_per_token(self) -> float:
        """Model FLOPs per token of training (PaLM's 6·N + 12·L·H·Q·T): N the matmul weights
        of the blocks and the head (vocab·hidden, tied or not, unpadded, as nanoGPT counts
        it), not the embedding lookups, norms or biases."""
        return _flops_per_token(self.config)


# ---- building it -------------------------------------------------------------------


def _linear(name, kind, style, out_features, in_features, bias, *, sp_bias=False):
    split = {"colwise": 0, "rowwise": 1}[style]
    params = [ParamDesc(name="weight", shape=(out_features, in_features), split_dim=split)]
    if bias:  # a column-parallel bias is split with its rows; a row-parallel one is whole
        params.append(ParamDesc(name="bias", shape=(out_features,), split_dim=0 if split == 0 else None,
                                sequence_parallel=sp_bias))
    return ModuleDesc(name=name, kind=kind, layer=LINEAR, style=style, params=tuple(params))


def _norm(name, kind, config):
    names = ("weight",) if config.arch == "llama" else ("weight", "bias")  # RMSNorm, LayerNorm
    params = tuple(ParamDesc(name=n, shape=(config.hidden,), sequence_parallel=True) for n in names)
    return ModuleDesc(name=name, kind=kind, layer=NORM, style=None, params=params)


def _block(config: ModelConfig, index: int) -> BlockDesc:
    """Block ``index``: the one place its modules are listed (an MoE block's MLP: expert_desc.py)."""
    C, D, F, bias = config.hidden, config.head_dim, config.ffn, config.arch == "gpt"
    q, kv = config.heads * D, config.kv_heads * D
    prefix = f"layers.{index}."

    def linear(kind, style, out_features, in_features, with_bias=bias):
        sp_bias = style == "rowwise"  # added after the reduce-scatter, on a sequence shard
        return _linear(prefix + kind, kind, style, out_features, in_features, with_bias, sp_bias=sp_bias)

    columns_bias = bias or config.attention_bias  # Qwen2: q, k, v biases, none on o
    modules = [
        _norm(prefix + "attn_norm", "attn_norm", config),
        linear("attn.q_proj", "colwise", q, C, columns_bias),
        linear("attn.k_proj", "colwise", kv, C, columns_bias),
        linear("attn.v_proj", "colwise", kv, C, columns_bias),
    ]
    modules.append(linear("attn.o_proj", "rowwise", C, q))
    if config.qk_norm:  # one (head_dim,) weight each, replicated; grads summed over tp in backward
        modules += [ModuleDesc(name=f"{prefix}attn.{n}", kind=f"attn.{n}", layer=NORM, style=None,
                               params=(ParamDesc(name="weight", shape=(D,)),)) for n in ("q_norm", "k_norm")]
    modules.append(_norm(prefix + "mlp_norm", "mlp_norm", config))
    if config.is_moe(index):  # only a build with experts ships expert_desc.py
        from .expert_desc import moe_modules

        modules += moe_modules(config, prefix)
        return BlockDesc(index=index, modules=tuple(modules), heads=config.heads, kv_heads=config.kv_heads,
                         head_dim=D, ffn=config.expert_hidden, experts=config.experts, top_k=config.top_k)
    if config.arch == "llama":  # SwiGLU: silu(gate) · up
        modules.append(linear("mlp.gate_proj", "colwise", F, C))
    modules += [linear("mlp.up_proj", "colwise", F, C), linear("mlp.down_proj", "rowwise", C, F)]
    return BlockDesc(index=index, modules=tuple(modules), heads=config.heads, kv_heads=config.kv_heads,
                     head_dim=D, ffn=F)


@functools.lru_cache(maxsize=256)
def describe(config: ModelConfig) -> ModelDesc:
    """The description of ``config``'s model (runtime/models/model.py builds exactly this)."""
    V, C = config.padded_vocab, config.hidden
    embed = [ModuleDesc(name="embed", kind="embed", layer=EMBEDDING, style="vocab",
                        params=(ParamDesc(name="weight", shape=(V, C), split_dim=0),))]
    if config.arch == "gpt":  # learned positions, replicated
        embed.append(ModuleDesc(name="pos_embed", kind="pos_embed", layer=EMBEDDING, style=None,
                                params=(ParamDesc(name="weight", shape=(config.seq_len, C),
                                                  sequence_parallel=True),)))
    head = (
        _norm("final_norm", "final_norm", config),
        ModuleDesc(name="head", kind="head", layer=LINEAR, style="vocab_head",
                   params=(ParamDesc(name="weight", shape=(V, C), split_dim=0),),
                   tied_to="embed" if config.tie_embeddings else None),
    )
    blocks = tuple(_block(config, i) for i in range(config.layers))
    return ModelDesc(config=config, embed=tuple(embed), blocks=blocks, head=head)


@functools.lru_cache(maxsize=256)
def _by_name(config: ModelConfig) -> dict[str, ModuleDesc]:
    return {m.name: m for m in describe(config).modules}


@functools.lru_cache(maxsize=256)
def _flops_per_token(config: ModelConfig) -> float:
    head = 6.0 * config.vocab * config.hidden
    return sum(b.flops_per_token(config.seq_len) for b in describe(config).blocks) + head
