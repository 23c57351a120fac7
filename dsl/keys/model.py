"""The ``model`` block's keys, the mixture-of-experts ones as ``MOE_KEYS`` (runtime/parallel/expert/moe.py)."""

from __future__ import annotations

from .types import BlockDef, LAYERS_MAX, Param, _int

MOE_KEYS = (
    _int("experts", "routed experts of a mixture-of-experts MLP (0: dense)", minimum=0, default="0"),
    _int("top_k", "experts each token is routed to", default="2"),
    _int("expert_ffn", "hidden size of each expert's MLP", default="ffn"),
    _int("moe_every", "every N-th block is MoE (blocks 0, N, 2N, ...; as Megatron's moe_layer_freq)",
         default="1"),
    _int("first_dense_layers", "the first k blocks are dense, the MoE blocks follow (DeepSeek's "
         "first_k_dense_replace; with moe_every, blocks i ≥ k with i % moe_every = 0)", minimum=0, default="0"),
    _int("shared_experts", "always-on experts (DeepSeek), one MLP of shared_experts·expert_ffn",
         minimum=0, default="0"),
    Param(
        name="router",
        type="enum",
        choices=("softmax", "sigmoid"),
        default="softmax",
        doc="router scores: softmax (Mixtral) or sigmoid (DeepSeek-V3); the top-k weights sum to 1",
    ),
    Param(
        name="capacity_factor",
        type="number",
        or_none=True,
        default="none",
        exclusive_minimum=0,
        doc="none: dropless; X: each expert takes at most ceil(X·tokens·top_k/experts) tokens",
    ),
    Param(
        name="aux_loss",
        type="number",
        default="0.01",
        minimum=0,
        doc="coefficient of the load-balancing loss (Switch/GShard)",
    ),
    Param(
        name="aux_loss_scope",
        type="enum",
        choices=("micro_batch", "sequence"),
        default="micro_batch",
        doc="the tokens the balance loss is taken over: the micro-batch's (Switch/GShard), or each "
        "sequence's, averaged (DeepSeek-V3's sequence-wise loss, a small aux_loss beside the router bias)",
    ),
    Param(name="z_loss", type="number", default="0", minimum=0, doc="coefficient of the router z-loss"),
    Param(
        name="router_bias_update",
        type="number",
        default="0",
        minimum=0,
        doc="auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias added to the scores only to "
        "choose the top_k, after each step bias += r·sign(mean load − load); 0: off",
    ),
    Param(
        name="routing_imbalance",
        type="number",
        default="1",
        minimum=1,
        doc="for the planner only: the busiest expert-parallel rank's routed tokens over the mean "
        "(1: dropless and balanced); scales its expert compute, all-to-all and activations",
    ),
)
"""The mixture-of-experts keys of ``model`` (runtime/parallel/expert/moe.py)."""

MODEL = BlockDef(
    name="model",
    named=True,
    doc="the transformer to train",
    keys=(
        Param(
            name="arch",
            type="enum",
            choices=("gpt", "llama"),
            required=True,
            doc="gpt: LayerNorm, GELU MLP, learned positions; llama: RMSNorm, SwiGLU, rotary",
        ),
        _int("layers", "transformer blocks", required=True, maximum=LAYERS_MAX,
             limit=f"parc plans and builds each block on its own, so it takes at most {LAYERS_MAX:,} "
             "(deep models have a few hundred)"),
        _int("hidden", "model width", required=True),
        _int("heads", "attention heads", required=True),
        _int("kv_heads", "key/value heads (grouped-query attention)", default="heads"),
        _int("head_dim", "features of each attention head (Qwen3: 128 on hidden 4096 with 64 heads); "
             "even under llama (rotary turns pairs)", default="hidden / heads"),
        Param(name="qk_norm", type="bool", default="false",
              doc="llama: RMSNorm over each head of q and k before rotary (Qwen3, OLMo-2)"),
        Param(name="attention_bias", type="bool", default="false",
              doc="llama: biases on the q, k and v projections, none on o (Qwen2)"),
        _int("ffn", "hidden size of the MLP (llama: of each SwiGLU branch)", required=True),
        _int("vocab", "vocabulary size", required=True),
        _int("seq_len", "tokens per sequence", required=True),
        _int(
            "pad_vocab_to",
            "the embedding has vocab rounded up to a multiple of this",
            default="128",
        ),
        Param(
            name="dropout",
            type="number",
            doc="dropout probability",
            default="0.0",
            minimum=0,
            exclusive_maximum=1,
        ),
        Param(
            name="norm_eps",
            type="number",
            doc="epsilon of the norms",
            default="1e-5",
            exclusive_minimum=0,
        ),
        Param(
            name="rope_theta",
            type="number",
            doc="rotary base (llama)",
            default="10000.0",
            exclusive_minimum=0,
        ),
        Param(
            name="documents",
            type="enum",
            choices=("joined", "separate"),
            default="joined",
            doc="separate: attention and positions stay inside each document of a sequence (the data's "
            "documents: a token file's OUT.idx, synthetic data's drawn ones); joined: they cross documents",
        ),
        Param(
            name="tie_embeddings",
            type="bool",
            doc="the head shares the embedding's weight",
            default="true for gpt, false for llama",
        ),
        *MOE_KEYS,
    ),
)
