"""The checked, normalized spec: what every stage after the front end reads.

Takes: nothing (built by ``dsl/validate.py`` from the AST or from JSON). Gives:
``Spec`` and its four parts. Units are resolved to SI numbers (bytes, bytes/s,
FLOP/s, seconds). Degrees the user left ``auto`` are ``None`` (the planner fills them;
``parc build`` refuses a spec that still has any). Every key's source position is kept
in ``Spec.spans`` so generated code and later diagnostics can cite the spec line.

Before: ``dsl/validate.py``. After: ``codegen/`` (lowering to the Plan).
"""

from __future__ import annotations

import enum
import os
from dataclasses import MISSING, dataclass, field, replace

from parc.runtime.layout.constraints import per_layer
from parc.runtime.layout.model_record import unchecked_config
from parc.runtime.layout.model_desc import ModelConfig, ModelDesc, describe
from parc.runtime.schedules.schedule import KINDS

from .diagnostics import Span
from .keys.layout_options import SpecOptions


class Arch(enum.Enum):
    GPT = "gpt"
    LLAMA = "llama"


PipelineSchedule = enum.Enum("PipelineSchedule", [("ONE_F_ONE_B" if kind == "1f1b" else kind.upper(), kind)
                                                 for kind in KINDS], module=__name__)
"""The pipeline schedules: the schedule table's kinds (``runtime/schedules/schedule.KINDS``);
``1f1b``, not a name, is ``ONE_F_ONE_B``."""


class Recompute(enum.Enum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Precision(enum.Enum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class Kernels(enum.Enum):
    COMPILED = "compiled"
    EAGER = "eager"


class DataKind(enum.Enum):
    SYNTHETIC = "synthetic"
    TOKENS = "tokens"


class LrScheduleKind(enum.Enum):
    CONSTANT = "constant"
    COSINE = "cosine"
    LINEAR = "linear"
    WSD = "wsd"


class DecayShape(enum.Enum):
    """The shape of ``wsd``'s decay (``runtime/optimizers/optim.py``'s ``lr_at``)."""

    LINEAR = "linear"
    COSINE = "cosine"
    SQRT = "sqrt"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """The model block: the runtime's ``ModelConfig`` (``runtime/layout/model_desc.py``, the
    one record of the model's shape: what train.py builds and a checkpoint records) and the
    keys only the compiler reads.

    Note [one model record]: the block's shape keys are ``config``'s fields and read as the
    spec's own (``spec.model.hidden`` is ``spec.model.config.hidden``), so no field is
    copied between two records; the spans stay in ``Spec.spans`` under ``model.<key>``.
    ``expert_ffn`` is the key as written (None: ``ffn``); ``config.expert_ffn`` is the
    size train.py writes whenever there are experts.
    """

    name: str
    """The model block's name (``model gpt_tiny { ... }``); a Python identifier."""
    config: ModelConfig
    pad_vocab_to: int = 128
    """The embedding table has ``config.padded_vocab`` rows: ``vocab`` rounded up to this."""
    expert_ffn: int | None = None
    """Hidden size of each expert as written; None: ``ffn``."""
    routing_imbalance: float = 1.0
    """The planner's: the busiest ep rank's routed tokens over the mean (cost/experts.py)."""

    def __getattr__(self, key: str):  # only for what ModelSpec lacks: the config's fields
        if key == "config":  # not set yet (unpickling): never recurse
            raise AttributeError(key)
        return getattr(self.config, key)

    @property
    def arch(self) -> Arch:
        return Arch(self.config.arch)

    @property
    def desc(self) -> ModelDesc:
        """``model_desc.describe(config)`` (memoized there): module names and shapes, parameter
        counts, FLOPs and saved activations, which the passes and the cost model read."""
        return describe(self.config)

    @classmethod
    def of(cls, *, name: str, pad_vocab_to: int = 128, routing_imbalance: float = 1.0, **shape) -> "ModelSpec":
        """The block from its keys: ``shape`` the ``ModelConfig`` fields (``arch`` an ``Arch``
        or its word; ``padded_vocab`` from ``pad_vocab_to``; ``expert_ffn`` as written). The
        record is built unchecked: the rules report a bad shape at its spec line."""
        arch = Arch(shape.pop("arch"))
        written = shape.get("expert_ffn")
        if written is None and shape.get("experts", 0):
            shape["expert_ffn"] = shape["ffn"]  # train.py writes EXPERT_FFN whenever there are experts
        padded = -(-shape["vocab"] // pad_vocab_to) * pad_vocab_to
        defaults = {name: f.default for name, f in ModelConfig.__dataclass_fields__.items()
                    if f.default is not MISSING}
        config = unchecked_config(**(defaults | shape | {"arch": arch.value, "padded_vocab": padded}))
        return cls(name=name, config=config, pad_vocab_to=pad_vocab_to, expert_ffn=written,
                   routing_imbalance=routing_imbalance)


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshSpec:
    nodes: int
    devices_per_node: int
    device: str
    """Preset name: a100-40gb, a100-80gb, h100-80gb, h200, rtx3090, cpu."""
    device_memory: float | None
    """Bytes per device (from the preset unless given); None for cpu without a value."""
    device_flops: float | None
    """Dense peak FLOP/s per device (from the preset unless given); None for cpu."""
    intra_node: float
    """Bandwidth between devices in a node, bytes/s, per direction."""
    inter_node: float
    """Bandwidth between nodes, bytes/s, per device, per direction."""
    intra_node_latency: float = 5e-6
    """Seconds."""
    inter_node_latency: float = 10e-6
    """Seconds."""
    profile: str | None = None
    """A ``parc profile`` JSON file as written in the spec (relative to the spec file), or None."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelSpec(SpecOptions):
    """The layout. ``None`` means ``auto`` (left to the planner). The options beyond the
    degrees and the per-layer settings are ``SpecOptions``' fields (``dsl/keys/layout_options.py``,
    Note [one record of the options])."""

    dp: int | None
    tp: int | None
    pp: int | None
    sp: bool | None = False
    zero: int | None = 0
    zero_prefetch: int = 1
    """ZeRO-3: units whose all-gather runs ahead of the one computing."""
    schedule: PipelineSchedule | None = PipelineSchedule.ONE_F_ONE_B
    chunks: int = 1
    """Virtual stages per rank (``interleaved(chunks = v)``); 1 otherwise."""
    recompute: Recompute | tuple[Recompute, ...] | None = Recompute.NONE
    """One mode for every block, or a tuple with one per block (Note [per-layer values])."""
    overlap: int | tuple[int, ...] | None = 1
    """Oases sub-batches per micro-batch (1: no overlap); or one per block."""
    stage_layers: tuple[int, ...] | None = None
    """Explicit layers per pipeline stage, or None for an even split."""
    compress: str | None = "none"
    """Data-parallel gradient compression: ``none``, ``powersgd`` or ``topk`` (runtime/parallel/data/compress.py);
    None: ``auto``, the planner's choice of ``powersgd`` or ``none``."""
    compress_rank: int = 4
    """``powersgd(rank = r)``."""
    compress_ratio: float = 0.01
    """``topk(ratio = x)``."""
    error_feedback: bool = True
    layer_tp: tuple[int, ...] | None = None
    """Each block's tensor-parallel degree when they differ (``tp`` written as a list);
    ``tp`` is then the largest, the coarse split of a stage (Note [heterogeneous layouts])."""
    layer_dp: tuple[int, ...] | None = None
    """Each block's data-parallel degree when they differ; ``dp`` is then the fewest."""

    def degrees(self, layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Each block's (tp, dp): the lists, or the one degree for every block."""
        tp = self.layer_tp or (self.tp,) * layers
        dp = self.layer_dp or (self.dp,) * layers
        return tuple(tp), tuple(dp)

    def setting(self, name: str):
        """A per-layer setting (``layer_settings.SETTINGS``) as plain values: one value,
        one per block, or None (auto)."""
        value = getattr(self, name)
        plain = lambda one: one.value if isinstance(one, enum.Enum) else one  # noqa: E731
        return tuple(plain(one) for one in value) if isinstance(value, tuple) else plain(value)

    def layer_values(self, name: str, layers: int) -> tuple:
        """Each block's plain value of a per-layer setting (a scalar applies to every block)."""
        return per_layer(self.setting(name), layers)

    def with_settings(self, values: dict) -> "ParallelSpec":
        """This layout with per-layer settings given as plain values (the planner's)."""
        typed = {"recompute": Recompute}  # the settings the spec holds as enums
        def one(name, value):
            kind = typed.get(name)
            return value if kind is None else kind(value)
        return replace(self, **{
            name: tuple(one(name, v) for v in value) if isinstance(value, tuple) else one(name, value)
            for name, value in values.items()
        })

    @property
    def is_complete(self) -> bool:
        """True when no value is left to the planner."""
        return self.options_set and None not in (
            self.dp,
            self.tp,
            self.pp,
            self.cp,
            self.ep,
            self.sp,
            self.zero,
            self.schedule,
            self.compress,
            self.recompute,
            self.overlap,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerSpec:
    name: str = "adamw"
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    eps: float = 1e-8


@dataclass(frozen=True, slots=True, kw_only=True)
class LrScheduleSpec:
    kind: LrScheduleKind = LrScheduleKind.COSINE
    warmup: int = 0
    """Steps of linear warmup: step s ≤ warmup runs at peak·s/warmup (step 1 at peak/warmup)."""
    min_lr_ratio: float = 0.1
    """Final LR as a fraction of the peak (cosine, linear, wsd)."""
    decay: int = 0
    """``wsd``: the last ``decay`` steps decay from the peak to ``min_lr_ratio``·peak."""
    shape: DecayShape = DecayShape.LINEAR
    """``wsd``: the decay's shape."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSpec:
    kind: DataKind = DataKind.SYNTHETIC
    path: str | tuple[str, ...] | None = None
    """For ``tokens("path.bin")``: the path exactly as written in the spec; a tuple of
    them for a blend (``tokens(["a.bin", "b.bin"], weights = [3, 7])``)."""
    dtype: str = "uint16"
    """Element type of a token file: uint16 or uint32."""
    val_path: str | tuple[str, ...] | None = None
    """``tokens(..., val = "val.bin")``: the validation file as written (a tuple: one per
    file of a blend, blended by the same weights); None: a held-out tail of each file."""
    weights: tuple[float, ...] = ()
    """A blend's weights, one per file of ``path`` (PAR0216); () for one file or equal shares."""

    @property
    def files(self) -> tuple[str, ...]:
        """The token files, one for a single file."""
        return tuple(self.path) if isinstance(self.path, (tuple, list)) else (() if self.path is None else (self.path,))

    @property
    def blended(self) -> bool:
        return isinstance(self.path, (tuple, list))


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainSpec:
    global_batch: int
    """Sequences per optimizer step, over all data-parallel ranks."""
    micro_batch: int | None
    """Sequences per forward/backward on one rank; None for ``auto`` (the planner picks)."""
    steps: int
    optimizer: OptimizerSpec = OptimizerSpec()
    lr_schedule: LrScheduleSpec = LrScheduleSpec()
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    precision: Precision = Precision.FP32
    master_weights: str = "fp32"
    """The optimizer's weights and moments under bf16/fp16: fp32 (the only choice today)."""
    grad_reduce: str = "fp32"
    """The dtype of the data-parallel gradient reduction: fp32, or bf16 (every zero stage; the shards stay fp32)."""
    seed: int = 1234
    data: DataSpec = DataSpec()
    log_every: int = 1
    checkpoint_every: int = 0
    """``checkpoint = every(N, dir)`` gives N; ``none`` gives 0 (no checkpoints)."""
    checkpoint_dir: str | None = None
    """The folder of ``every(N, dir)``, exactly as written; None for ``none``."""
    eval_every: int = 0
    """``eval = every(N, batches = B)`` gives N; ``none`` gives 0 (no evaluation)."""
    eval_batches: int = 0
    """B: global batches of validation sequences per evaluation (0 without eval)."""
    tensorboard_dir: str | None = None
    """``log = tensorboard(dir)``: the folder as written; None for ``stdout``."""
    init_from: str | None = None
    """``init = checkpoint(dir)``: the checkpoint's folder as written (relative to the spec's
    folder); None for ``none`` (parc's own initialization)."""
    on_nonfinite: str = "stop"
    """``skip`` the optimizer step or ``stop`` the run on a non-finite loss or grad norm."""
    kernels: Kernels = Kernels.COMPILED
    """The fused ops: compiled kernels (falling back to eager when they cannot be built) or eager."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Spec:
    model: ModelSpec
    mesh: MeshSpec
    parallel: ParallelSpec
    train: TrainSpec
    source: str
    """The spec file as the user named it (relative path or name, never made absolute)."""
    spans: tuple[tuple[str, Span], ...] = field(default=(), compare=False)
    """(dotted key, span of its value) for every key written in the file or by --set,
    sorted by key. Keys use the language's names: ``parallel.tp``, ``train.steps``."""

    def span(self, key: str) -> Span | None:
        """Where ``key`` (e.g. ``"parallel.tp"``) was written, or None if defaulted."""
        for name, span in self.spans:
            if name == key:
                return span
        return None

    def resolve(self, written: str) -> str:
        """A path written in the spec (``tokens("x.bin")``, ``mesh.profile``), as the
        running process can open it: a relative path is relative to the spec's folder,
        wherever parc is run from."""
        return os.path.join(os.path.dirname(self.source), written)

    @property
    def layout_complete(self) -> bool:
        """True when no layout value (parallel keys, ``train.micro_batch``) is left to the planner."""
        return self.parallel.is_complete and self.train.micro_batch is not None

    def grad_accum(self) -> int | None:
        """Micro-batches per step on one rank, or None while dp or micro_batch is auto."""
        if self.parallel.dp is None or self.train.micro_batch is None:
            return None
        return self.train.global_batch // (self.train.micro_batch * self.parallel.dp)
