"""The Plan IR: the single description of what every rank of a build does.

Takes: nothing (built by the lowering passes of ``codegen/lower.py`` from a checked
``Spec``). Gives: ``Plan`` and its parts — the mesh (axes, ranks, process groups),
the tensor-parallel table, sequence parallelism, the per-layer layout, the batch plan and the
model/optimizer/data/training settings the trainer needs. Every decision keeps the
``Span`` of the spec text behind it (``None`` when the value is parc's default), so
generated code can cite its origin.

``str(plan)`` is a stable text form (tests, ``parc build --emit plan``) and
``plan.to_json()`` is the content of the build's ``plan.json``; both live in
``codegen/plan_text.py``. Before: ``codegen/passes/*``. After: ``codegen/render.py``.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from parc.dsl.diagnostics import Span
from parc.dsl.keys.layout_options import in_plan
from parc.runtime.layout.axes import coordinates, partition
from parc.runtime.layout.layer_settings import SETTINGS, LayerSetting


def cited(key: str, when=None, note: str = "") -> dict:
    """The metadata of a ``Setting`` field that holds one spec key's value, named after the
    key (``parallel.zero_prefetch``: ZERO_PREFETCH); ``when(spec)``: the layouts that have it
    (else the field keeps its default). ``from_spec`` fills these fields."""
    return {"cited": (key, when, note)}


def from_spec(record: type, spec) -> dict:
    """The fields of ``record`` marked ``cited``, for ``spec``: each a ``Setting`` with the
    key's value and span, where the field's ``when`` holds."""
    fields = {}
    for f in dataclasses.fields(record):
        key, when, note = f.metadata.get("cited", (None, None, ""))
        if key is None or (when is not None and not when(spec)):
            continue
        block, name = key.split(".")
        value = getattr(getattr(spec, block), name)
        fields[f.name] = Setting(name=name.upper(), value=tuple(value) if isinstance(value, list) else value,
                                 span=spec.span(key), note=note)
    return fields


def with_options(part: str):
    """A class decorator for the Plan's ``part`` (``mesh``, ``model``, ``train``): adds the
    ``cited`` fields of the layout options placed there (``dsl/keys/layout_options.py``'s
    ``cited_in``, Note [one record of the options]; each documented there), after the class's
    own: a ``Setting``, required when every layout has it, else None where it lacks it."""
    def add(record: type) -> type:
        for name, option, when, note in in_plan(part):
            record.__annotations__[name] = "Setting" if when is None else "Setting | None"
            cite = cited(f"parallel.{option}", when=when, note=note)
            setattr(record, name, field(metadata=cite) if when is None else field(default=None, metadata=cite))
        return record
    return add


class ShardStyle(enum.Enum):
    """How one module's weight is split over the tp axis (runtime-api.md, layers)."""

    COLWISE = "colwise"
    """Output features split: weight (out/tp, in)."""
    ROWWISE = "rowwise"
    """Input features split: weight (out, in/tp); output all-reduced."""
    VOCAB = "vocab"
    """Embedding rows split: table (padded_vocab/tp, hidden)."""
    VOCAB_HEAD = "vocab_head"
    """Output projection with vocab-parallel logits: weight (padded_vocab/tp, hidden)."""
    REPLICATE = "replicate"
    """Every tp rank holds the whole weight."""


# ---------------------------------------------------------------------------
# Mesh: axes, ranks, groups


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshAxis:
    axis: str
    """Its name in the axis registry (``runtime/layout/axes.py``: pp, dp, tp)."""
    size: int
    """Ranks along this axis (1 when the layout does not use it)."""
    span: Span | None
    """The spec text that set the degree; None when defaulted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankPlacement:
    rank: int
    """Global rank (torchrun's RANK)."""
    node: int
    """Which node the rank runs on: ``rank // devices_per_node``."""
    local_rank: int
    """Device index on its node (torchrun's LOCAL_RANK)."""
    coords: tuple[tuple[str, int], ...]
    """Index along each mesh axis, in mesh order (mixed-radix digits of the rank)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessGroup:
    axis: str
    ranks: tuple[int, ...]
    """Global ranks of the group, ascending; they differ only in their ``axis`` index."""


@dataclass(frozen=True, slots=True, kw_only=True)
@with_options("mesh")
class MeshPlan:
    axes: tuple[MeshAxis, ...]
    """Every axis of the registry (``runtime/layout/axes.py``) in mesh order, size-1 axes included."""
    nodes: int
    devices_per_node: int
    device: str
    """Device preset name (``cpu``, ``h100-80gb``, ...)."""
    device_flops: float | None
    """Dense peak FLOP/s of one device, for MFU: ``mesh.device_flops`` (a preset's or
    written), else the best matmul rate of the ``mesh.profile`` file (the planner's peak,
    ``cost/hardware.profile_peak_flops``); None when unknown (cpu without a profile)."""
    device_flops_from_profile: Span | None = None
    """Where ``mesh.profile`` is written, when ``device_flops`` came from it."""
    nodes_span: Span | None
    devices_span: Span | None
    device_span: Span | None

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def tp_grid(self) -> tuple[int, int] | None:
        """The tp ranks' 2D grid ``(R, C)`` (Note [2D tensor parallelism]); None for 1D tp."""
        return None if self.tp_shape is None else tuple(self.tp_shape.value)

    @property
    def ranks(self) -> tuple[RankPlacement, ...]:
        """One entry per global rank, ascending: derived from the axes, never stored (a
        mesh of 100,000 ranks stays a few lines of plan.json; ``runtime/layout/axes.py``)."""
        shape = tuple((axis.axis, axis.size) for axis in self.axes)
        return tuple(
            RankPlacement(
                rank=rank, node=rank // self.devices_per_node, local_rank=rank % self.devices_per_node,
                coords=tuple(coordinates(rank, shape).items()),
            )
            for rank in range(self.world_size)
        )

    @property
    def groups(self) -> tuple[ProcessGroup, ...]:
        """For each axis in mesh order, the groups partitioning the ranks, by first rank."""
        shape = tuple((axis.axis, axis.size) for axis in self.axes)
        return tuple(ProcessGroup(axis=name, ranks=ranks) for name, _ in shape for ranks in partition(shape, (name,)))

    def size(self, axis: str) -> int:
        for mesh_axis in self.axes:
            if mesh_axis.axis == axis:
                return mesh_axis.size
        raise KeyError(axis)

    def axis(self, axis: str) -> MeshAxis:
        for mesh_axis in self.axes:
            if mesh_axis.axis == axis:
                return mesh_axis
        raise KeyError(axis)


# ---------------------------------------------------------------------------
# Tensor and sequence parallelism


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRule:
    """One row of the tensor-parallel table: module-name pattern → style."""

    pattern: str
    """Module name as the runtime names it, ``*`` standing for the layer index."""
    style: ShardStyle
    dim: int | None
    """The weight dim split over tp (0 = output rows, 1 = input columns); None when replicated."""
    full_shape: tuple[int, ...]
    """The whole weight's shape (elements per dim)."""
    local_shape: tuple[int, ...]
    """The shard one tp rank holds."""
    tied_to: str | None = None
    """The module whose weight this one shares (tied embeddings), or None."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParallelPlan:
    size: int
    """tp degree; 1 means the model is not split and ``rules`` is empty."""
    rules: tuple[ShardRule, ...]
    """Every module of the model, in model order (replicated ones included)."""
    span: Span | None

    @property
    def sharded(self) -> tuple[ShardRule, ...]:
        return tuple(rule for rule in self.rules if rule.style is not ShardStyle.REPLICATE)


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceParallelPlan:
    enabled: bool
    """Norms, residual adds and dropout run on T/tp between the blocks' tp regions
    (Note [blocks as regions] in runtime/models/model.py; Korthikanti et al.)."""
    local_shape: tuple[int, ...]
    """Activation shape inside a region, (micro_batch, seq_len/tp, hidden); () when disabled."""
    span: Span | None


# ---------------------------------------------------------------------------
# Pipeline parallelism


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePlan:
    """How the layers are split into pipeline stages and in what order they run."""

    size: int
    """pp degree; 1 means no pipeline (one stage holding every layer)."""
    schedule: str
    """``gpipe``, ``1f1b`` or ``interleaved`` (runtime/schedules/schedule.py)."""
    chunks: int
    """Model chunks (virtual stages) per pipeline rank; > 1 only when interleaved."""
    slices: int = 1
    """Token slices per sequence under a sliced schedule (``schedule.SLICED``); 1 otherwise."""
    slice_lengths: tuple[int, ...] | None = None
    """Tokens of each slice where the spec lists them (uneven slices); None: equal."""
    micro_batches: int
    """Micro-batches per optimizer step on each pipeline (= grad_accum)."""
    stage_layers: tuple[tuple[int, int], ...]
    """Layers ``(start, stop)`` of each virtual stage, in model order; chunk c of
    pipeline rank r is virtual stage c·size + r."""
    bubble_fraction: float
    """Idle share of the step, from the schedule's own timeline (forward 1, backward 2)."""
    span: Span | None
    schedule_span: Span | None
    stage_layers_span: Span | None
    stage_costs: tuple[tuple[int, int, int], ...] | None = None
    """Each virtual stage's (F, B, W) of a micro-batch, in integer units of the planner's cost
    model, for a schedule ordered by them (``schedule.STAGE_COSTS``); else None
    (codegen/planner/cost/bubble.py, Note [stage costs])."""


# ---------------------------------------------------------------------------
# Per-layer layout


class LayerKind(enum.Enum):
    EMBED = "embed"
    """Token (and, gpt, position) embedding: the first layer."""
    BLOCK = "block"
    """One transformer block, ``layers.{i}``."""
    HEAD = "head"
    """Final norm, output projection and loss: the last layer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerLayout:
    """How one layer of the model is laid out over the ranks of its pipeline stage.

    Note [per-layer layout]: ``Plan.layers`` holds the embedding, every block and the
    head, in model order. A uniform layout is the case where every block's entry is
    equal, and renders the scalar constants of before (``RECOMPUTE = "full"``); a
    setting that differs between blocks renders one value per block. The embedding
    and head follow their neighbouring block's degrees and carry each per-layer
    setting's ``off`` value. Each per-layer setting of ``layer_settings.SETTINGS`` is a
    field of the same name.
    """

    name: str
    """``embed``, ``layers.{i}`` or ``head`` (the runtime's module prefix)."""
    kind: LayerKind
    stage: int
    """The virtual pipeline stage holding it (``PipelinePlan.stage_layers``)."""
    tp: int
    """Tensor-parallel degree of this layer."""
    dp: int
    """Data-parallel degree of this layer (dp · tp is the stage's rank count)."""
    sp: bool
    """Sequence parallelism: the layer's norms run on T/tp."""
    recompute: str
    """``none``, ``selective`` (attention core) or ``full`` (the block from its input)."""
    overlap: int
    """Oases sub-batches of the block's tensor-parallel collectives; 1: no overlap."""
    spans: tuple[tuple[str, Span | None], ...] = field(default=(), metadata={"mapping": True})
    """Where the spec gave each per-layer setting (``layer_settings.SETTINGS``), by name
    (pairs, so the Plan stays frozen; ``plan.json`` shows them as an object)."""

    def span(self, name: str) -> Span | None:
        return dict(self.spans).get(name)


# ---------------------------------------------------------------------------
# Batches and training settings


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchPlan:
    micro_batch: int
    """Sequences per forward/backward on one rank."""
    grad_accum: int
    """Micro-batches per optimizer step on one rank."""
    dp: int
    """Data-parallel ranks sharing a step."""
    global_batch: int
    """Sequences per optimizer step: micro_batch · grad_accum · dp."""
    seq_len: int
    """Tokens per sequence."""
    micro_batch_span: Span | None
    global_batch_span: Span | None

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step, over all ranks."""
        return self.global_batch * self.seq_len


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """A named value the trainer uses as written (a config constant)."""

    name: str
    """The constant's name in ``train.py`` (upper case)."""
    value: bool | int | float | str | tuple | None
    """A plain Python literal; emitted with ``repr``."""
    span: Span | None
    """Where the spec wrote it; None when parc's default."""
    note: str = ""
    """Why, when the value is derived or defaulted (shown in the citation comment)."""


@dataclass(frozen=True, slots=True, kw_only=True)
@with_options("model")
class ModelPlan:
    name: str
    """The model block's name; validated as a Python identifier."""
    arch: str
    """``gpt`` or ``llama``."""
    settings: tuple[Setting, ...]
    """The runtime ``ModelConfig`` fields, in its order."""
    parameters: int
    """Parameters of the whole (unsharded) model."""
    expert_parallel: Setting | None = field(default=None, metadata=cited(
        "parallel.ep", when=lambda spec: spec.model.experts, note="expert-parallel ranks"))
    """EP: the ranks that split each MoE block's experts (runtime/parallel/expert/moe.py); None for a
    dense model (plan.json leaves it out)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DataPlan:
    kind: str
    """``synthetic`` or ``tokens``."""
    path: str | tuple[str, ...] | None
    """Token file as written in the spec (a tuple: a blend's files); resolved at run time from the cwd."""
    dtype: str
    """Element type of the token file (``uint16`` | ``uint32``)."""
    val_path: str | tuple[str, ...] | None = None
    """The validation token file as written (a tuple: one per file of a blend); None: ``eval``
    holds out the file's last tenth."""
    weights: tuple[float, ...] = ()
    """A blend's weights as written, one per file; () for one file or equal shares."""
    span: Span | None


@dataclass(frozen=True, slots=True, kw_only=True)
@with_options("train")
class TrainPlan:
    steps: Setting
    seed: Setting
    precision: Setting
    grad_clip: Setting
    log_every: Setting
    optimizer: tuple[Setting, ...]
    """AdamW: LR, BETAS, WEIGHT_DECAY, EPS."""
    lr_schedule: tuple[Setting, ...]
    """LR_SCHEDULE, WARMUP, MIN_LR_RATIO (and DECAY, DECAY_SHAPE under ``wsd``): the
    keyword arguments of ``optim.lr_at`` (``lr_schedule_args``)."""
    data: DataPlan
    zero: Setting
    """ZeRO stage: 0 (none), 1 (AdamW state sharded over dp) or 2 (state and gradients)."""
    checkpoint_every: Setting
    """CHECKPOINT_EVERY: steps between checkpoints, 0 for ``checkpoint = none``."""
    checkpoint_dir: Setting
    """CHECKPOINT_DIR: the folder of ``every(N, dir)`` as written, None for ``none``."""
    eval_every: Setting
    """EVAL_EVERY: steps between evaluations (and after the last), 0 for ``eval = none``."""
    eval_batches: Setting
    """EVAL_BATCHES: global batches of validation sequences per evaluation."""
    tensorboard_dir: Setting
    """TENSORBOARD_DIR: the folder of ``log = tensorboard(dir)`` as written, None for ``stdout``."""
    on_nonfinite: Setting
    """ON_NONFINITE: ``skip`` or ``stop`` on a non-finite loss or gradient norm."""
    kernels: Setting
    """KERNELS: the fused ops, "compiled" (runtime/kernels) or "eager"."""
    init_from: Setting
    """INIT_FROM: the checkpoint of ``init = checkpoint(dir)`` as ``train.py`` finds it (from
    its folder), None for ``none`` (runtime/checkpoints/checkpoint_init.py)."""
    grad_reduce: Setting | None = field(default=None, metadata=cited(
        "train.grad_reduce", when=lambda spec: spec.train.grad_reduce != "fp32"))
    """GRAD_REDUCE when ``train.grad_reduce = bf16`` (runtime/parallel/data/dp.py's ``reduce_dtype``); None for fp32."""
    zero_prefetch: Setting | None = field(default=None, metadata=cited(
        "parallel.zero_prefetch", when=lambda spec: spec.parallel.zero == 3))
    """ZERO_PREFETCH under zero = 3 (runtime/parallel/data/fsdp.py, Note [prefetch]); None otherwise."""
    compress: tuple[Setting, ...] = ()
    """COMPRESS, COMPRESS_RANK or COMPRESS_RATIO (``parallel.compress``, runtime/parallel/data/compress.py),
    ERROR_FEEDBACK; COMPRESS_PP_RANK, COMPRESS_STAGES, LAZY_ERROR (the pipeline's
    backward compression, codegen/render_compress.py): those of what is compressed; empty when nothing is."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictionPlan:
    """What the planner predicted for the layout it chose (``choose_layout``; docs/planner.md)."""

    layouts_considered: int
    accounting: str
    """``parc`` (parc's trainer) or ``megatron`` (mixed precision), codegen/planner/cost/layout.py."""
    step_time_s: float
    tokens_per_s: float
    tflops_per_device: float
    mfu: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    peak_mem_bytes: float
    """Peak bytes of the fullest pipeline rank: the five parts below."""
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    source: str
    """Base name of the spec file (never a path: builds must not depend on the cwd)."""
    parc_version: str
    mesh: MeshPlan
    tensor_parallel: TensorParallelPlan
    sequence_parallel: SequenceParallelPlan
    pipeline: PipelinePlan
    batch: BatchPlan
    model: ModelPlan
    train: TrainPlan
    layers: tuple[LayerLayout, ...]
    """Embedding, each block, head, in model order (Note [per-layer layout])."""
    predicted: PredictionPlan | None = None
    """The planner's prediction when it chose the layout (the spec had ``auto``); else None."""

    @property
    def blocks(self) -> tuple[LayerLayout, ...]:
        """The transformer blocks' layouts, ``layers.0`` first."""
        return tuple(layer for layer in self.layers if layer.kind is LayerKind.BLOCK)

    def per_block(self, field: str) -> tuple:
        """``field`` of every block, in order."""
        return tuple(getattr(layer, field) for layer in self.blocks)

    def uniform(self, field: str):
        """``field`` when every block has the same value, else None."""
        values = set(self.per_block(field))
        return values.pop() if len(values) == 1 else None

    def used_settings(self) -> tuple[LayerSetting, ...]:
        """The per-layer settings some block uses (Note [a per-layer setting is an entry])."""
        return tuple(entry for entry in SETTINGS if entry.used(self.per_block(entry.name)))

    def __str__(self) -> str:
        from .plan_text import plan_to_text

        return plan_to_text(self)

    def to_json(self) -> str:
        """plan.json's content: every field, sorted keys, spans as ``file:line:col``."""
        from .plan_text import plan_to_json

        return plan_to_json(self)
