"""The ``parallel`` block's keys: the layout (any may be ``auto``). The keys of the layout's
options (cp, ep and how they split, the tp grid, ZeRO-3's sharding, the pipeline's
compression) sit beside their fields in ``dsl/keys/layout_options.py`` (Note [one record of the
options]); ``with_keys`` places each in this table's order."""

from __future__ import annotations

from parc.runtime.schedules.schedule import KINDS, words

from .layout_options import with_keys
from .types import BlockDef, CallDef, Param, _int


def _schedule_call(kind: str) -> CallDef:
    """The ``schedule`` key's call of ``kind``: its doc and arguments are the schedule table's
    (``runtime/schedules/schedule.words``: each kind's module holds its own)."""
    said = words(kind)
    return CallDef(name=kind, doc=said.doc, params=tuple(
        _int(arg.name, arg.doc, minimum=arg.minimum, required=True, lengths_field=arg.lengths_field,
             or_list=_int(*arg.each) if arg.each else None)
        for arg in said.args))


PARALLEL = BlockDef(
    name="parallel",
    may_be_auto=True,
    doc="the layout; any key may be auto, and `parallel = auto` leaves all to the planner",
    keys=with_keys((  # and each option's key, from its field (dsl/keys/layout_options.py)
        _int("dp", "data-parallel degree; or one per layer (with tp's, dp[i]·tp[i] equal)", required=True, auto=True,
             per_layer=True),
        _int("tp", "tensor-parallel degree; or one per layer, the rest of the stage's ranks data parallel",
             required=True, auto=True, per_layer=True),
        _int("pp", "pipeline-parallel degree (stages)", required=True, auto=True),
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
            name="schedule",
            type="call",
            auto=True,
            default="1f1b",
            doc="pipeline schedule",
            calls=tuple(_schedule_call(kind) for kind in KINDS),
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
            name="compress",
            type="call",
            default="none",
            auto=True,
            whole_auto=False,
            lossy=True,
            doc="compress the data-parallel gradient reduction (changes numerics: convergence, "
            "not parity, is tested); auto lets the planner turn PowerSGD on (parallel = auto leaves it none)",
            calls=(
                CallDef(name="none", doc="exact all-reduce of every gradient"),
                CallDef(
                    name="powersgd",
                    doc="PowerSGD: each weight gradient as a rank-`rank` product P·Qᵀ, Q warm-started",
                    params=(_int("rank", "rank of the approximation", default="4", field="compress_rank"),),
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
                            field="compress_ratio",
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
    )),
)
