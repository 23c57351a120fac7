"""Every block, key and call of the language, as one table.

Takes: nothing (leaf module). Gives: ``BLOCKS`` (block name → ``BlockDef``), each
key's ``Param`` (type, range, default, whether it may be ``auto``, its calls) and
``expected_words`` for messages. ``dsl/schema.py`` generates the JSON Schema from
this table, ``dsl/normalize.py`` uses it to resolve units and calls, and
docs/language.md describes the same keys (a test keeps them in step).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import units

INT_MAX = 2**31 - 1
"""Largest integer any key accepts (keeps later stages' arithmetic sane)."""
LAYERS_MAX = 10_000
"""Most transformer blocks a model may have: parc describes, plans and renders each block
on its own (per-layer settings, the planner's per-layer costs), so its work and memory grow
with the count; 2³¹ − 1 blocks would take gigabytes before anything else is checked. Deep
models have a few hundred blocks."""
NUMBER_MAX = 1e12
"""Largest plain number a key accepts where it names no tighter bound (``lr``,
``rope_theta``, ``grad_clip``, ...): every number is finite and of a sane size
before it leaves the front end. Unit kinds have theirs in ``units.LARGEST``."""

NO_CONTROL = "^[^\x00-\x1f\x7f]*$"
"""Every string of a spec is a path (a token file, a folder, a profile): no control
characters, which no file name of a portable program holds (a tab or a newline written
as an escape in the spec would reach the file system otherwise). PAR0117."""
UNIT_TYPES = (units.SIZE, units.BANDWIDTH, units.FLOPS, units.TIME)
DEVICES = ("a100-40gb", "a100-80gb", "h100-80gb", "h200", "rtx3090", "cpu")


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    """A key of a block or an argument of a call."""

    name: str
    type: str
    """int | number | bool | string | enum | int_list | pair | int_pair | call, or a unit kind
    (size | bandwidth | flops | time: written with a unit, stored in SI units)."""
    doc: str
    default: str | None = None
    """The default as docs show it; None when required or derived."""
    required: bool = False
    minimum: float | None = None
    exclusive_minimum: float | None = None
    maximum: float | None = None
    exclusive_maximum: float | None = None
    choices: tuple[str, ...] = ()
    auto: bool = False
    """``auto`` is allowed (left to the planner)."""
    whole_auto: bool = True
    """``parallel = auto`` makes it ``auto`` too (``cp`` stays 1 unless written ``auto``)."""
    calls: tuple["CallDef", ...] = ()
    per_layer: bool = False
    """Also takes a list with one value per transformer block (``[full, none, ...]``)."""
    or_none: bool = False
    """The word ``none`` is also allowed (``capacity_factor = none``: no limit)."""
    limit: str | None = None
    """Why ``maximum`` is what it is, where it is tighter than the type's (the hint of PAR0109)."""
    or_list: "Param | None" = None
    """Also takes a list of two or more of these elements (``terapipe(slices = [16, 8, 8])``:
    the slices' token lengths instead of their count)."""

    def __post_init__(self) -> None:
        # Every number has an upper bound (NUMBER_MAX, units.LARGEST) unless given one.
        if self.maximum is None and self.exclusive_maximum is None:
            largest = units.LARGEST.get(self.type, NUMBER_MAX if self.type == "number" else None)
            object.__setattr__(self, "maximum", largest)

    def call(self, name: str) -> "CallDef | None":
        for call in self.calls:
            if call.name == name:
                return call
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallDef:
    """One function a call-valued key accepts: ``interleaved(chunks = 2)``."""

    name: str
    params: tuple[Param, ...] = ()
    doc: str = ""

    def param(self, name: str) -> Param | None:
        for param in self.params:
            if param.name == name:
                return param
        return None

    def signature(self) -> str:
        if not self.params:
            return self.name
        inner = ", ".join(p.name if p.required else f"{p.name} = {p.default}" for p in self.params)
        return f"{self.name}({inner})"


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockDef:
    name: str
    doc: str
    keys: tuple[Param, ...]
    named: bool = False
    """``model NAME { ... }`` takes a name; the other blocks do not."""
    may_be_auto: bool = False
    """``parallel = auto``."""

    def key(self, name: str) -> Param | None:
        for key in self.keys:
            if key.name == name:
                return key
        return None


def _int(name, doc, *, minimum=1, **kw) -> Param:
    return Param(
        name=name, type="int", doc=doc, minimum=minimum, maximum=kw.pop("maximum", INT_MAX), **kw
    )


_WARMUP = _int("warmup", "steps of linear warmup (step s at peak·s/warmup)", minimum=0, default="0")
_MIN_LR = Param(
    name="min_lr_ratio",
    type="number",
    doc="final LR as a fraction of the peak",
    default="0.1",
    minimum=0,
    maximum=1,
)

MOE_KEYS = (
    _int("experts", "routed experts of a mixture-of-experts MLP (0: dense)", minimum=0, default="0"),
    _int("top_k", "experts each token is routed to", default="2"),
    _int("expert_ffn", "hidden size of each expert's MLP", default="ffn"),
    _int("moe_every", "every N-th block is MoE (blocks 0, N, 2N, ...; as Megatron's moe_layer_freq)",
         default="1"),
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
    Param(name="z_loss", type="number", default="0", minimum=0, doc="coefficient of the router z-loss"),
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
            name="tie_embeddings",
            type="bool",
            doc="the head shares the embedding's weight",
            default="true for gpt, false for llama",
        ),
        *MOE_KEYS,
    ),
)

MESH = BlockDef(
    name="mesh",
    doc="the hardware",
    keys=(
        _int("nodes", "machines", required=True),
        _int("devices_per_node", "accelerators (or CPU ranks) per machine", required=True),
        Param(name="device", type="enum", choices=DEVICES, required=True, doc="device preset"),
        Param(
            name="device_memory",
            type=units.SIZE,
            doc="memory per device",
            default="preset",
            exclusive_minimum=0,
        ),
        Param(
            name="device_flops",
            type=units.FLOPS,
            doc="dense peak per device",
            default="preset",
            exclusive_minimum=0,
        ),
        Param(
            name="intra_node",
            type=units.BANDWIDTH,
            default="preset",
            doc="bandwidth between devices of a node, per direction",
            exclusive_minimum=0,
        ),
        Param(
            name="inter_node",
            type=units.BANDWIDTH,
            default="preset",
            doc="bandwidth between nodes, per device, per direction",
            exclusive_minimum=0,
        ),
        Param(
            name="intra_node_latency",
            type=units.TIME,
            default="5 us",
            doc="latency of a message within a node",
            minimum=0,
        ),
        Param(
            name="inter_node_latency",
            type=units.TIME,
            default="10 us",
            doc="latency of a message between nodes",
            minimum=0,
        ),
        Param(
            name="profile",
            type="string",
            doc="a `parc profile` file (relative to the spec) whose measurements the planner uses",
        ),
    ),
)

PARALLEL = BlockDef(
    name="parallel",
    may_be_auto=True,
    doc="the layout; any key may be auto, and `parallel = auto` leaves all to the planner",
    keys=(
        _int("dp", "data-parallel degree; or one per layer (with tp's, dp[i]·tp[i] equal)", required=True, auto=True,
             per_layer=True),
        _int("tp", "tensor-parallel degree; or one per layer, the rest of the stage's ranks data parallel",
             required=True, auto=True, per_layer=True),
        _int("pp", "pipeline-parallel degree (stages)", required=True, auto=True),
        _int(
            "cp",
            "context-parallel degree: ranks that split each sequence (seq_len / cp tokens each); "
            "auto lets the planner choose it (parallel = auto leaves it 1)",
            default="1",
            auto=True,
            whole_auto=False,
        ),
        _int("ep", "expert-parallel degree: ranks that split each MoE layer's experts; auto lets the "
             "planner choose it (parallel = auto leaves it 1)", default="1", auto=True, whole_auto=False),
        _int("etp", "expert tensor-parallel degree: ranks that split each expert's ffn; auto lets the "
             "planner choose it among the divisors of tp (parallel = auto leaves it 1)", default="1", auto=True,
             whole_auto=False),
        Param(
            name="cp_kind",
            type="enum",
            choices=("ring", "ulysses", "allgather"),
            default="ring",
            doc="how attention sees the whole sequence under cp > 1: ring (K/V blocks passed "
            "around the cp group, load-balanced chunks), ulysses (all-to-all to head shards) or "
            "allgather (gather K/V)",
        ),
        Param(
            name="sp",
            type="bool",
            auto=True,
            default="false",
            doc="sequence parallelism (shards norms and dropout along tp)",
        ),
        _int(
            "zero",
            "ZeRO stage: 0 off, 1 optimizer state, 2 + gradients, 3 + parameters",
            minimum=0,
            maximum=3,
            default="0",
            auto=True,
        ),
        _int(
            "zero_prefetch",
            "zero = 3: blocks whose all-gather is launched ahead of the one computing",
            minimum=0,
            default="1",
        ),
        Param(
            name="zero_shard",
            type="enum",
            choices=("dp", "node"),
            default="dp",
            doc="zero = 3: shard parameters over every dp rank (dp), or over the dp ranks of "
            "one node and replicate across nodes (node: hybrid sharding, HSDP)",
        ),
        Param(
            name="schedule",
            type="call",
            auto=True,
            default="1f1b",
            doc="pipeline schedule",
            calls=(
                CallDef(name="gpipe", doc="all forwards, then all backwards"),
                CallDef(name="1f1b", doc="one forward, one backward"),
                CallDef(
                    name="interleaved",
                    doc="1f1b over `chunks` virtual stages per rank",
                    params=(_int("chunks", "virtual stages per rank", minimum=2, required=True),),
                ),
                CallDef(
                    name="zero_bubble",
                    doc="ZB-H1: 1f1b with backward split into input and weight gradients, "
                    "the weight gradients filling the bubble",
                ),
                CallDef(name="zero_bubble_v", doc="ZB-V: zero-bubble over two chunks per rank in a V"),
                CallDef(name="chimera", doc="two pipelines in opposite directions over the stages, pp even"),
                CallDef(
                    name="terapipe",
                    doc="each sequence pipelined in S token slices (causal models), 1f1b over the slices",
                    params=(
                        _int("slices", "token slices per sequence; or a list of each slice's tokens, "
                             "summing to seq_len (uneven slices, as the paper's)", minimum=2, required=True,
                             or_list=_int("slice", "the tokens of one slice")),
                    ),
                ),
            ),
        ),
        Param(
            name="recompute",
            type="enum",
            choices=("none", "selective", "full"),
            auto=True,
            default="none",
            per_layer=True,
            doc="activation recomputation; one value, or a list of one per layer",
        ),
        Param(
            name="overlap",
            type="call",
            auto=True,
            default="none",
            per_layer=True,
            doc="overlap tensor-parallel communication with compute; one value, or a list of one per layer",
            calls=(
                CallDef(name="none", doc="no overlap"),
                CallDef(
                    name="sub_batch",
                    doc="split each micro-batch in `sub_batches` parts",
                    params=(
                        _int("sub_batches", "parts per micro-batch", minimum=2, required=True),
                    ),
                ),
            ),
        ),
        Param(
            name="stage_layers",
            type="int_list",
            auto=True,
            default="an even split",
            doc="layers of each pipeline stage, e.g. [5, 7]",
        ),
        Param(
            name="tp_shape",
            type="int_pair",
            default="(1, tp)",
            auto=True,
            whole_auto=False,
            doc="2D tensor parallelism: the tp ranks as an R × C grid (R·C = tp), weights split over "
            "both sides; (1, tp) is 1D; auto lets the planner choose (parallel = auto leaves it 1D)",
        ),
        Param(
            name="compress",
            type="call",
            default="none",
            auto=True,
            whole_auto=False,
            doc="compress the data-parallel gradient reduction (changes numerics: convergence, "
            "not parity, is tested); auto lets the planner turn PowerSGD on (parallel = auto leaves it none)",
            calls=(
                CallDef(name="none", doc="exact all-reduce of every gradient"),
                CallDef(
                    name="powersgd",
                    doc="PowerSGD: each weight gradient as a rank-`rank` product P·Qᵀ, Q warm-started",
                    params=(_int("rank", "rank of the approximation", default="4"),),
                ),
                CallDef(
                    name="topk",
                    doc="send the `ratio` fraction of gradient entries of largest magnitude",
                    params=(
                        Param(
                            name="ratio",
                            type="number",
                            doc="fraction of entries sent per step",
                            default="0.01",
                            exclusive_minimum=0,
                            maximum=1,
                        ),
                    ),
                ),
            ),
        ),
        Param(
            name="error_feedback",
            type="bool",
            default="true",
            doc="with compress: what a step's compression of the dp gradients leaves out is added to "
            "the next step's gradient",
        ),
        Param(
            name="compress_pp",
            type="call",
            default="none",
            doc="compress the gradients pipeline stages send back (changes numerics)",
            calls=(
                CallDef(name="none", doc="send them whole"),
                CallDef(
                    name="lowrank",
                    doc="Optimus-CC's compressed backpropagation: each as a rank-`rank` P·Qᵀ",
                    params=(
                        _int("rank", "rank of the approximation", default="4"),
                        Param(
                            name="lazy_error",
                            type="bool",
                            default="false",
                            doc="lazy error propagation: what P·Qᵀ leaves out is added to the next "
                            "micro-batch's gradient",
                        ),
                    ),
                ),
            ),
        ),
        Param(
            name="compress_stages",
            type="int_list",
            default="every stage but the first",
            doc="with compress_pp: the stages whose input gradient is sent back compressed, e.g. [2, 3]",
        ),
    ),
)

TRAIN = BlockDef(
    name="train",
    doc="the training run",
    keys=(
        _int(
            "global_batch",
            "sequences per optimizer step, over all data-parallel ranks",
            required=True,
        ),
        _int(
            "micro_batch",
            "sequences per forward/backward on one rank (auto: the planner picks)",
            required=True,
            auto=True,
        ),
        _int("steps", "optimizer steps", required=True),
        Param(
            name="optimizer",
            type="call",
            default="adamw",
            doc="optimizer",
            calls=(
                CallDef(
                    name="adamw",
                    doc="AdamW",
                    params=(
                        Param(
                            name="lr",
                            type="number",
                            doc="peak learning rate",
                            default="3e-4",
                            exclusive_minimum=0,
                        ),
                        Param(name="betas", type="pair", doc="Adam betas", default="(0.9, 0.95)"),
                        Param(
                            name="weight_decay",
                            type="number",
                            doc="decoupled weight decay",
                            default="0.1",
                            minimum=0,
                        ),
                        Param(
                            name="eps",
                            type="number",
                            doc="Adam epsilon",
                            default="1e-8",
                            exclusive_minimum=0,
                        ),
                    ),
                ),
            ),
        ),
        Param(
            name="schedule",
            type="call",
            default="cosine",
            doc="learning-rate schedule",
            calls=(
                CallDef(name="constant", doc="warmup, then the peak LR", params=(_WARMUP,)),
                CallDef(name="cosine", doc="warmup, then cosine decay", params=(_WARMUP, _MIN_LR)),
                CallDef(name="linear", doc="warmup, then linear decay", params=(_WARMUP, _MIN_LR)),
            ),
        ),
        Param(
            name="grad_clip",
            type="number",
            doc="max global gradient norm; 0 disables",
            default="1.0",
            minimum=0,
        ),
        Param(
            name="precision",
            type="enum",
            choices=("fp32", "bf16", "fp16"),
            default="fp32",
            doc="compute precision",
        ),
        Param(
            name="master_weights",
            type="enum",
            choices=("fp32",),
            default="fp32",
            doc="the optimizer's copy of the weights (and its Adam moments) under bf16/fp16",
        ),
        Param(
            name="grad_reduce",
            type="enum",
            choices=("fp32", "bf16"),
            default="fp32",
            doc="the dtype gradients are reduced in over the data-parallel ranks",
        ),
        _int("seed", "random seed", minimum=0, maximum=2**32 - 1, default="1234"),
        Param(
            name="data",
            type="call",
            default="synthetic",
            doc="training data",
            calls=(
                CallDef(name="synthetic", doc="random tokens from the seed"),
                CallDef(
                    name="tokens",
                    doc="a flat token file (parc data prepare)",
                    params=(
                        Param(
                            name="path", type="string", required=True, doc="the file, as written"
                        ),
                        Param(
                            name="dtype",
                            type="enum",
                            choices=("uint16", "uint32"),
                            default="uint16",
                            doc="element type",
                        ),
                        Param(
                            name="val",
                            type="string",
                            doc="a validation token file (same dtype) for `eval`; without it, "
                            "the file's last tenth is held out",
                        ),
                    ),
                ),
            ),
        ),
        _int("log_every", "steps between log lines", default="1"),
        Param(
            name="eval",
            type="call",
            default="none",
            doc="validation loss on held-out data (logged as val_loss)",
            calls=(
                CallDef(name="none", doc="no evaluation"),
                CallDef(
                    name="every",
                    doc="every `steps` steps and after the last: the mean loss of `batches` global batches",
                    params=(
                        _int("steps", "steps between evaluations", required=True),
                        _int("batches", "global batches of validation sequences per evaluation", default="4"),
                    ),
                ),
            ),
        ),
        Param(
            name="log",
            type="call",
            default="stdout",
            doc="where step metrics go besides stdout (and the trainer's --metrics-jsonl)",
            calls=(
                CallDef(name="stdout", doc="one line per step on rank 0 (the trainer's --tensorboard adds scalars)"),
                CallDef(
                    name="tensorboard",
                    doc="also TensorBoard scalars in `dir` (needs the tensorboard package at run time)",
                    params=(
                        Param(
                            name="dir",
                            type="string",
                            required=True,
                            doc="folder of the event files, relative to the cwd",
                        ),
                    ),
                ),
            ),
        ),
        Param(
            name="checkpoint",
            type="call",
            default="none",
            doc="sharded checkpoints (the trainer's --checkpoint-dir/--checkpoint-every override it)",
            calls=(
                CallDef(name="none", doc="no checkpoints unless --checkpoint-dir is given"),
                CallDef(
                    name="every",
                    doc="save every `steps` steps, and after the last, into `dir`",
                    params=(
                        _int("steps", "steps between checkpoints", required=True),
                        Param(
                            name="dir",
                            type="string",
                            default='"checkpoints"',
                            doc="folder of the checkpoints, relative to the cwd",
                        ),
                    ),
                ),
            ),
        ),
        Param(
            name="init",
            type="call",
            default="none",
            doc="the starting weights (the trainer's --init-from overrides it)",
            calls=(
                CallDef(name="none", doc="parc's own initialization from the seed"),
                CallDef(
                    name="checkpoint",
                    doc="the weights of a parc checkpoint (parc import writes one), in any layout; a fresh "
                    "optimizer from step 1",
                    params=(
                        Param(
                            name="dir",
                            type="string",
                            required=True,
                            doc="the checkpoint, or a folder of them (its latest), relative to the spec's folder",
                        ),
                    ),
                ),
            ),
        ),
        Param(
            name="on_nonfinite",
            type="enum",
            choices=("skip", "stop"),
            default="stop",
            doc="a non-finite loss or gradient norm: skip the optimizer step, or stop the run",
        ),
        Param(
            name="kernels",
            type="enum",
            choices=("compiled", "eager"),
            default="compiled",
            doc="fused ops: compiled kernels (C++ on CPU, Triton on CUDA) or eager PyTorch",
        ),
    ),
)

BLOCKS: dict[str, BlockDef] = {b.name: b for b in (MODEL, MESH, PARALLEL, TRAIN)}

ELEMENT = {
    "int_list": _int("stage_layers", "layers of a stage"),
    "pair": Param(name="beta", type="number", doc="an Adam beta", minimum=0, exclusive_maximum=1),
    "int_pair": _int("tp_shape", "ranks along one side of the tensor-parallel mesh"),
}
"""The element of a list-valued type."""


def list_element(param: Param) -> Param | None:
    """What each item of a list written for ``param`` is: for a per-layer key, the key's
    own single value (``recompute = [full, none]``; Note [per-layer values] in
    ``dsl/normalize.py``), else its ``or_list`` element or ``ELEMENT`` of its type."""
    if param.per_layer:
        return replace(param, per_layer=False, auto=False)
    return param.or_list or ELEMENT.get(param.type)


def expected_words(param: Param) -> str:
    """What ``param`` takes, for messages: "an integer or auto"."""
    if param.type in UNIT_TYPES:
        words = f"{units.KIND_WORDS[param.type]} such as {units.KIND_EXAMPLES[param.type]}"
    elif param.type == "enum":
        words = "one of " + ", ".join(param.choices)
    elif param.type == "call":
        words = "one of " + ", ".join(call.signature() for call in param.calls)
    else:
        words = {
            "int": "an integer",
            "number": "a number",
            "bool": "true, false" if param.auto else "true or false",
            "string": "a string",
            "int_list": "a list of integers such as [4, 4]",
            "pair": "a pair of numbers such as (0.9, 0.95)",
            "int_pair": "a pair of integers such as (2, 2)",
        }[param.type]
    if param.or_none:
        words += " or none"
    if param.per_layer:
        words += ", or a list of those with one per layer"
    if param.or_list is not None:
        words += ", or a list of integers such as [16, 8, 8]"
    return words + " or auto" if param.auto else words
