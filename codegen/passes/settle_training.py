"""Pass 10: the model's configuration and the training settings, as cited constants.

Takes: a buildable ``Spec``. Gives: ``draft.model`` (the runtime ``ModelConfig``
fields, each a ``Setting`` carrying the span of the spec text behind it, and the
parameter count, both from ``spec.model``: its ``config`` and ``desc``, Note [one model record]) and ``draft.train`` (steps,
seed, optimizer, LR schedule, data).

Before: ``lay_out_layers``. After: ``codegen/lower.py`` assembles the ``Plan``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import LrScheduleKind, Spec
from parc.runtime.layout import model_counts

from ..plan import DataPlan, ModelPlan, Setting, TrainPlan, from_spec
from .draft import Draft


def setting(spec: Spec, name: str, key: str, value, note: str = "") -> Setting:
    return Setting(name=name, value=value, span=spec.span(key), note=note)


def _moe_settings(spec: Spec, c) -> tuple[Setting, ...]:
    """The mixture-of-experts fields, only for a model with experts (a dense model's
    train.py stays as it was)."""
    if not c.experts:
        return ()
    return (
        setting(spec, "EXPERTS", "model.experts", c.experts, "routed experts of each MoE block"),
        setting(spec, "TOP_K", "model.top_k", c.top_k, "experts per token"),
        setting(spec, "EXPERT_FFN", "model.expert_ffn", c.expert_hidden, "hidden size of each expert"),
        setting(spec, "MOE_EVERY", "model.moe_every", c.moe_every, "blocks 0, N, 2N, ... are MoE"),
        *([setting(spec, "FIRST_DENSE_LAYERS", "model.first_dense_layers", c.first_dense_layers,
                   "blocks before it are dense")] if c.first_dense_layers else []),
        setting(spec, "SHARED_EXPERTS", "model.shared_experts", c.shared_experts),
        setting(spec, "ROUTER", "model.router", c.router),
        setting(spec, "CAPACITY_FACTOR", "model.capacity_factor", c.capacity_factor, "None: dropless"),
        setting(spec, "AUX_LOSS", "model.aux_loss", c.aux_loss, "load-balancing coefficient"),
        setting(spec, "Z_LOSS", "model.z_loss", c.z_loss, "router z-loss coefficient"),
        *([setting(spec, "AUX_LOSS_SCOPE", "model.aux_loss_scope", c.aux_loss_scope,
                   "the balance loss per sequence")] if c.aux_loss_scope != "micro_batch" else []),
        *([setting(spec, "ROUTER_BIAS_UPDATE", "model.router_bias_update", c.router_bias_update,
                   "auxiliary-loss-free balancing's rate")] if c.router_bias_update else []),
    )


def _attention_settings(spec: Spec, c) -> tuple[Setting, ...]:
    """``model.head_dim`` (when it is not hidden / heads), ``qk_norm`` and ``attention_bias``
    (when on): a model without them keeps its train.py as it was."""
    found = []
    if c.head_dim != c.hidden // c.heads or c.hidden % c.heads:
        found.append(setting(spec, "HEAD_DIM", "model.head_dim", c.head_dim, "features of each head"))
    if c.qk_norm:
        found.append(setting(spec, "QK_NORM", "model.qk_norm", c.qk_norm, "RMSNorm on each head of q and k"))
    if c.attention_bias:
        found.append(setting(spec, "ATTENTION_BIAS", "model.attention_bias", c.attention_bias, "q, k, v biases"))
    return tuple(found)


def run(spec: Spec, draft: Draft) -> Draft:
    m, t = spec.model, spec.train
    c = m.config  # the runtime's ModelConfig: its fields, in its order
    model = ModelPlan(
        name=m.name,
        arch=m.arch.value,
        settings=(
            setting(spec, "ARCH", "model.arch", c.arch),
            setting(spec, "LAYERS", "model.layers", c.layers),
            setting(spec, "HIDDEN", "model.hidden", c.hidden),
            setting(spec, "HEADS", "model.heads", c.heads),
            setting(spec, "KV_HEADS", "model.kv_heads", c.kv_heads, "defaults to heads"),
            setting(spec, "FFN", "model.ffn", c.ffn),
            setting(spec, "VOCAB", "model.vocab", c.vocab),
            setting(
                spec, "PADDED_VOCAB", "model.pad_vocab_to", c.padded_vocab,
                f"vocab rounded up to a multiple of {m.pad_vocab_to}",
            ),
            setting(spec, "SEQ_LEN", "model.seq_len", c.seq_len),
            setting(spec, "DROPOUT", "model.dropout", c.dropout),
            setting(spec, "NORM_EPS", "model.norm_eps", c.norm_eps),
            setting(spec, "ROPE_THETA", "model.rope_theta", c.rope_theta),
            setting(spec, "TIE_EMBEDDINGS", "model.tie_embeddings", c.tie_embeddings),
            *_moe_settings(spec, c),
            *([setting(spec, "DOCUMENTS", "model.documents", c.documents,
                       "attention and positions within each document")] if c.documents != "joined" else []),
            *_attention_settings(spec, c),
        ),
        parameters=model_counts.parameters(m.desc),  # runtime/layout/model_counts.py
        **from_spec(ModelPlan, spec),  # the layout's settings of the experts (plan.py's ``cited`` fields)
    )
    o, s = t.optimizer, t.lr_schedule
    train = TrainPlan(
        steps=setting(spec, "STEPS", "train.steps", t.steps),
        seed=setting(spec, "SEED", "train.seed", t.seed),
        precision=setting(spec, "PRECISION", "train.precision", t.precision.value),
        grad_clip=setting(spec, "GRAD_CLIP", "train.grad_clip", t.grad_clip),
        log_every=setting(spec, "LOG_EVERY", "train.log_every", t.log_every),
        optimizer=(
            setting(spec, "LR", "train.optimizer", o.lr),
            setting(spec, "BETAS", "train.optimizer", tuple(o.betas)),
            setting(spec, "WEIGHT_DECAY", "train.optimizer", o.weight_decay),
            setting(spec, "EPS", "train.optimizer", o.eps),
        ),
        lr_schedule=(
            setting(spec, "LR_SCHEDULE", "train.schedule", s.kind.value),
            setting(spec, "WARMUP", "train.schedule", s.warmup),
            setting(spec, "MIN_LR_RATIO", "train.schedule", s.min_lr_ratio),
            *(
                (setting(spec, "DECAY", "train.schedule", s.decay),
                 setting(spec, "DECAY_SHAPE", "train.schedule", s.shape.value))
                if s.kind is LrScheduleKind.WSD else ()
            ),
        ),
        zero=setting(spec, "ZERO", "parallel.zero", spec.parallel.zero),
        data=DataPlan(
            kind=t.data.kind.value, path=t.data.path, dtype=t.data.dtype, val_path=t.data.val_path,
            weights=t.data.weights,
            span=spec.span("train.data"),
        ),
        eval_every=setting(spec, "EVAL_EVERY", "train.eval", t.eval_every),
        eval_batches=setting(spec, "EVAL_BATCHES", "train.eval", t.eval_batches),
        checkpoint_every=setting(spec, "CHECKPOINT_EVERY", "train.checkpoint", t.checkpoint_every),
        checkpoint_dir=setting(spec, "CHECKPOINT_DIR", "train.checkpoint", t.checkpoint_dir),
        tensorboard_dir=setting(spec, "TENSORBOARD_DIR", "train.log", t.tensorboard_dir),
        on_nonfinite=setting(spec, "ON_NONFINITE", "train.on_nonfinite", t.on_nonfinite),
        kernels=setting(spec, "KERNELS", "train.kernels", t.kernels.value),
        init_from=setting(spec, "INIT_FROM", "train.init", t.init_from),
        **from_spec(TrainPlan, spec),  # those only some layouts have (plan.py's ``cited`` fields)
        compress=compress_settings(spec),
    )
    return replace(draft, model=model, train=train)


def compress_settings(spec) -> tuple:
    """COMPRESS, its argument and ERROR_FEEDBACK (runtime/parallel/data/compress.py); COMPRESS_PP_RANK,
    COMPRESS_STAGES and LAZY_ERROR (runtime/parallel/pipeline/compress_pp.py): those of what is compressed."""
    par = spec.parallel
    found = []
    if par.compress != "none":
        found += [
            setting(spec, "COMPRESS", "parallel.compress", par.compress),
            setting(spec, "COMPRESS_RANK", "parallel.compress", par.compress_rank, "rank of P·Qᵀ")
            if par.compress == "powersgd"
            else setting(spec, "COMPRESS_RATIO", "parallel.compress", par.compress_ratio, "entries sent"),
            setting(spec, "ERROR_FEEDBACK", "parallel.error_feedback", par.error_feedback),
        ]
    if par.compress_pp != "none":
        stages = par.compress_stages or tuple(range(1, par.pp))  # default: every stage but the first
        found += [
            setting(spec, "COMPRESS_PP_RANK", "parallel.compress_pp", par.compress_pp_rank, "rank of P·Qᵀ"),
            setting(spec, "COMPRESS_STAGES", "parallel.compress_stages", stages,
                    "every stage but the first" if par.compress_stages is None else ""),
            setting(spec, "LAZY_ERROR", "parallel.compress_pp", par.compress_pp_lazy_error),
        ]
    return tuple(found)

