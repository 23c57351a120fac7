"""The ``train`` block's keys: the run."""

from __future__ import annotations

from .types import BlockDef, CallDef, Param, _int

_WARMUP = _int("warmup", "steps of linear warmup (step s at peak·s/warmup)", minimum=0, default="0")
_MIN_LR = Param(
    name="min_lr_ratio",
    type="number",
    doc="final LR as a fraction of the peak",
    default="0.1",
    minimum=0,
    maximum=1,
    limit="min_lr_ratio is the final LR as a fraction of the peak: 0 decays to nothing, 1 not at all",
)
_DECAY = _int("decay", "steps of the final decay to min_lr_ratio·peak (the last `decay` steps)", required=True)
_SHAPE = Param(
    name="shape",
    type="enum",
    choices=("linear", "cosine", "sqrt"),
    default="linear",
    doc="the decay's shape: linear, half a cosine, or 1 − sqrt (progress)",
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
                CallDef(
                    name="wsd",
                    doc="warmup-stable-decay: warmup, the peak LR, then a decay over the last `decay` steps",
                    params=(_WARMUP, _DECAY, _MIN_LR, _SHAPE),
                ),
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
                            name="path",
                            type="string",
                            required=True,
                            doc="the file, as written",
                            or_list=Param(
                                name="file", type="string", doc="one file of a blend (with `weights`)"
                            ),
                        ),
                        Param(
                            name="weights",
                            type="number",
                            exclusive_minimum=0,
                            doc="a blend's share of each file, in the order of `path` (any positive "
                            "numbers: [3, 7] is [0.3, 0.7]); without it, equal shares",
                            or_list=Param(
                                name="weight", type="number", exclusive_minimum=0, doc="one file's share"
                            ),
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
                            doc="a validation token file (same dtype) for `eval`, or one per file "
                            "of a blend; without it, each file's last tenth is held out",
                            or_list=Param(name="file", type="string", doc="one validation file"),
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
