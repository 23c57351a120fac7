"""The features a build may use, one entry each: when a Plan uses it, its spec keys, what
``train.py`` imports for it, what else of the runtime it ships, the transform it applies and
where the cost model prices it.

Takes: a ``Plan``. Gives: ``FEATURES``, ``in_use(plan)``, ``train_imports(plan)`` (the
runtime modules train.py imports, by their own names: ``runtime_tree.import_lines`` writes
them) and ``runtime_modules(plan)`` (those and what the runtime imports only inside a
function, which the closure of module-level imports in ``runtime_tree.files`` cannot see).
Before: nothing. After: ``render.py`` (the import lines) and ``build.py`` (what ships).

Note [a feature is an entry]: like ``layer_settings.SETTINGS`` for per-layer settings, a
feature's facts sit in one ``Feature``; the renderer and the build loop over ``FEATURES``
instead of naming the feature. A new axis or option adds an entry here (its ``used``
test reads the Plan field its pass fills), its spec keys in dsl/keys/, its rules
and unbuilt pairs in runtime/layout's rules, its transform beside its axis in
runtime/parallel/, and its cost in codegen/planner/cost/ (DESIGN.md walks through it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from parc.runtime.schedules import schedule

from . import (render_compress, render_context, render_data, render_eval, render_hetero, render_moe, render_optimizer,
               render_pipeline, render_step, render_tensor)
from .plan import Plan
from .plan_text import cite


@dataclass(frozen=True, slots=True, kw_only=True)
class Feature:
    name: str
    keys: tuple[str, ...]
    """The spec keys that turn it on."""
    used: Callable[[Plan], bool]
    imports: tuple[str, ...] = ()
    """Runtime modules train.py imports for it (their own names)."""
    ships: Callable[[Plan], frozenset] = lambda plan: frozenset()
    """Runtime modules imported only inside a function when it runs (shipped, not imported)."""
    transform: str = ""
    """The runtime code that applies it (module.function), for the reader."""
    step: str = ""
    """Its step of ``runtime/layout/transforms.ORDER``, if it transforms the model."""
    step_lines: Callable[[Plan], list] = lambda plan: []
    """train.py's lines for that step (``render_model`` places them in the order)."""
    adds: Callable[[Plan], dict] = lambda plan: {}
    """What it adds to train.py's sections: section name → its calls and lines
    (codegen/view.py, Note [a section is a list of calls])."""
    cost: str = ""
    """The planner's module that prices it (codegen/planner/cost/)."""


def _zero(plan: Plan) -> int:
    return plan.train.zero.value


def _zero_checkpoints(plan: Plan) -> frozenset:
    """Under ZeRO (any stage, per-layer layouts too) checkpoints lay out its flat buffers
    (checkpoints/checkpoint_flat.py, imported by ``checkpoint.py`` when the optimizer is ZeRO's)."""
    return frozenset({"checkpoint_flat"} if _zero(plan) else ())


def _pipeline_modules(plan: Plan) -> frozenset:
    """The schedule's modules and the stages' builder (``model.build_stages``: models/pipeline_stages.py)."""
    return frozenset(pipeline_modules(plan.pipeline.schedule) | {"pipeline_stages"})


def _expert_modules(plan: Plan) -> frozenset:
    """The experts' fused ops (kernels/ops_moe.py), their modules' description (expert_desc.py),
    their process groups (expert_folding.py: imported by train.py as ``expert folding``'s, read by
    HSDP's fsdp_units.py), a MoE block's tensor
    transform (sharding_moe.py) and, with sub-batches, their overlap."""
    return frozenset({"ops_moe", "expert_desc", "expert_folding", "sharding_moe"} | ({"moe_overlap"} if render_moe.overlaps_experts(plan) else set()))


def _replicates_kv(plan: Plan) -> bool:
    """Some block splits k_proj over more tp ranks than there are kv heads (Note [KV
    replication] in runtime/parallel/tensor/kv_replication.py)."""
    kv_heads = next(s.value for s in plan.model.settings if s.name == "KV_HEADS")
    return max(plan.per_block("tp")) > kv_heads


def pipeline_modules(kind: str) -> set[str]:
    """What a pipeline of schedule ``kind`` imports only when it runs: the kind's orders
    (``schedule.MODULES``) and the executor's module it runs with (``schedule.RUNS_WITH``)."""
    orders = {schedule.MODULES[kind]} if kind in schedule.MODULES else set()
    return orders | ({schedule.RUNS_WITH[kind]} if kind in schedule.RUNS_WITH else set())


FEATURES: tuple[Feature, ...] = (
    Feature(name="compiled kernels", keys=("train.kernels", "model.arch"),
            used=lambda plan: plan.train.kernels.value == "compiled",
            ships=lambda plan: frozenset({f"ops_{plan.model.arch}"}), transform="model.use_kernels"),
    Feature(name="llama", keys=("model.arch",), used=lambda plan: plan.model.arch == "llama",
            ships=lambda plan: frozenset({"llama_attention"}), transform="attention.Attention.rotate, llama_attention"),
    Feature(name="data parallel", keys=("parallel.dp", "parallel.cp"),
            adds=render_data.adds,
            used=lambda plan: plan.mesh.size("dp") * plan.mesh.size("cp") > 1 or render_hetero.enabled(plan),
            imports=("dp",), transform="dp.GradientBuckets", cost="cost/time.py"),
    Feature(name="pipeline", keys=("parallel.pp", "parallel.schedule", "parallel.stage_layers"),
            adds=render_pipeline.adds,
            used=render_step.has_pipeline, imports=("pipeline", "schedule"), ships=_pipeline_modules,
            transform="models.build_stages + pipeline.PipelineExecutor", cost="cost/time.py"),
    Feature(name="zero", keys=("parallel.zero",), used=lambda plan: _zero(plan) in (1, 2) and not render_hetero.enabled(plan),
            imports=("zero",), ships=_zero_checkpoints, transform="zero.ShardedAdamW", cost="cost/memory.py"),
    Feature(name="zero3", keys=("parallel.zero", "parallel.zero_prefetch", "parallel.zero_shard"),
            used=lambda plan: _zero(plan) == 3, imports=("fsdp",), ships=_zero_checkpoints, transform="fsdp.FullyShardedAdamW",
            cost="cost/memory.py"),
    Feature(name="per-layer tp × dp", keys=("parallel.tp", "parallel.dp"), used=render_hetero.enabled,
            adds=render_hetero.adds,
            imports=("hetero",), ships=lambda plan: _zero_checkpoints(plan) | {"sharding_layouts"},
            transform="parallelize.tensor(layouts=) + hetero.StageLayouts",
            cost="cost/per_layer.py"),
    Feature(name="context parallel", keys=("parallel.cp", "parallel.cp_kind"), used=lambda plan: plan.mesh.size("cp") > 1,
            adds=render_context.adds,
            ships=lambda plan: frozenset({"context", "ops_ring"}), transform="parallelize.context", cost="cost/context.py",
            step="context", step_lines=lambda plan: [
                f"# {cite(plan.mesh.axis('cp').span)}: attention over the ranks that split each sequence",
                "net = parallelize.context(net, cp_group, CP_KIND)"]),
    Feature(name="sequence parallel", keys=("parallel.sp",),  # per-layer layouts may turn sp on for some layers
            used=lambda plan: plan.sequence_parallel.enabled or render_hetero.enabled(plan),
            adds=lambda plan: render_tensor.sequence_adds(plan) if plan.sequence_parallel.enabled else {},
            ships=lambda plan: frozenset({"sp_columns", "comm_scatter"}),
            transform="parallelize.tensor(sequence_parallel=), layers.project (sp_columns.GatheredColumns)"),
    Feature(name="kv replication", keys=("parallel.tp", "model.kv_heads"), used=_replicates_kv,
            ships=lambda plan: frozenset({"kv_replication"}), transform="parallelize.tensor (kv_replication.ReplicatedHeads)"),
    Feature(name="2D tensor parallel", keys=("parallel.tp_shape",), used=lambda plan: plan.mesh.tp_shape is not None,
            adds=render_tensor.grid_adds,
            ships=lambda plan: frozenset({"layers2d", "sharding_grid"}), transform="parallelize.tensor(grid=)", cost="cost/tp2d.py"),
    Feature(name="experts", keys=("model.experts", "parallel.ep", "parallel.etp"), used=render_moe.has_experts,
            adds=render_moe.adds,
            imports=("moe",), ships=_expert_modules,
            transform="parallelize.experts", cost="cost/experts.py", step="experts",
            step_lines=render_moe.transform_lines),
    Feature(name="expert folding", keys=("parallel.ep", "parallel.etp"), used=render_moe.folds_experts,
            imports=("expert_folding",), transform="expert_folding.expert_groups", cost="cost/experts.py"),
    Feature(name="token data", keys=("train.data",),
            used=lambda plan: plan.train.data.kind == "tokens" or bool(plan.train.data.val_path),
            ships=lambda plan: frozenset({"tokens"}), transform="data.TokenFile / data.blend"),
    Feature(name="document separation", keys=("model.documents",), used=render_step.separate,
            ships=lambda plan: frozenset({"documents"}), transform="documents.attach"),
    Feature(name="router bias balancing", keys=("model.router_bias_update",), used=render_moe.balances_by_bias,
            imports=("router_bias",), transform="router_bias.update_router_bias", cost="cost/experts.py"),
    Feature(name="evaluation", keys=("train.eval",), used=render_eval.enabled, imports=("evaluate",),
            adds=render_eval.adds, ships=lambda plan: frozenset({"validation"}),
            transform="evaluate.Evaluator"),
    Feature(name="fp16 loss scaling", keys=("train.precision",), used=lambda plan: plan.train.precision.value == "fp16",
            adds=render_optimizer.loss_scale_adds,
            imports=("loss_scale",), transform="loss_scale.LossScaler"),
    Feature(name="master weights", keys=("train.precision",),
            used=lambda plan: bool(render_step.compute_dtype(plan)) and not _zero(plan), imports=("master",),
            transform="master.MasterAdamW", cost="cost/memory.py"),
    Feature(name="compress", keys=("parallel.compress",), used=render_compress.enabled, imports=("compress",),
            transform="compress.PowerSGD / compress.TopK", cost="cost/compress.py"),
    Feature(name="compress_pp", keys=("parallel.compress_pp",), used=render_compress.pipeline_enabled,
            imports=("compress_pp",), transform="compress_pp", cost="cost/compress.py"),
)
"""Every feature, in no particular order (each is independent of the others' entries)."""

ALWAYS = ("checkpoint", "checkpoint_init", "comm", "data", "faults", "flags", "memory", "mesh", "metrics", "model",
          "observe", "optim", "parallelize", "traffic")
"""What every train.py imports."""


def in_use(plan: Plan) -> tuple[Feature, ...]:
    return tuple(feature for feature in FEATURES if feature.used(plan))


def train_imports(plan: Plan) -> list[str]:
    """The runtime modules ``train.py`` imports, by their own names."""
    modules = set(ALWAYS)
    for feature in in_use(plan):
        modules |= set(feature.imports)
    return sorted(modules)


CUDA_KERNELS = frozenset({"triton_common", "triton_ops", "triton_add_norm", "triton_moe"})
"""The modules of ``kernels/`` only CUDA runs (Triton: ``kernels/backend.py`` imports them
for a CUDA tensor); ``kernels.select`` says so once when a build without them meets a GPU."""


BY_FEATURE_KERNELS = frozenset({"ops_gpt", "ops_llama", "ops_moe", "ops_ring", "reference"})
"""The modules of ``kernels/`` a build ships only when something names them: a feature's
``ships`` (the architecture's ops, the experts', ring attention's block attention: Note
[ops by feature] in kernels/ops.py) or a shipped module's import (``context.py``'s eager
``reference``)."""


def left_out(plan: Plan) -> frozenset:
    """Modules of a package that travels whole that this build does not ship: a CPU
    build's Triton kernels, the kernels of features it does not use."""
    device = CUDA_KERNELS if plan.mesh.device == "cpu" else frozenset()
    return device | (BY_FEATURE_KERNELS - runtime_modules(plan))


def runtime_modules(plan: Plan) -> set[str]:
    """The runtime modules the build's program needs before their own imports are
    followed (``build.runtime_files``): train.py's, each feature's ``ships``, a per-layer
    setting's ``LayerSetting.module`` when some block uses it, ``checkpoint_dcp``
    always (``checkpoint`` imports it to save or resume, Note [DCP on demand]),
    ``sharding``, the tensor transform every train.py runs (``parallelize.tensor``), and
    ``parallelize_steps`` when train.py runs a later step (a feature's, a per-layer setting's)."""
    modules = set(train_imports(plan)) | {"checkpoint_dcp", "sharding"}
    for feature in in_use(plan):
        modules |= feature.ships(plan)
    settings = plan.used_settings()
    if settings or any(feature.step_lines(plan) for feature in in_use(plan)):
        modules.add("parallelize_steps")  # parallelize.<step>'s work, after tensor
    return modules | {entry.module for entry in settings if entry.module}
