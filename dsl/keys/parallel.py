"""The ``parallel`` block's keys: the layout (any may be ``auto``)."""

from __future__ import annotations

from .types import BlockDef, CallDef, Param, _int

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
                             or_list=_int("slice", "the tokens of one slice"), lengths_field="slice_lengths"),
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
            auto_field="tp_shape_auto",
            one_rank="(1, 1)",
            doc="2D tensor parallelism: the tp ranks as an R × C grid (R·C = tp), weights split over "
            "both sides; (1, tp) is 1D; auto lets the planner choose (parallel = auto leaves it 1D)",
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
        Param(
            name="compress_pp",
            type="call",
            default="none",
            lossy=True,
            doc="compress the gradients pipeline stages send back (changes numerics)",
            calls=(
                CallDef(name="none", doc="send them whole"),
                CallDef(
                    name="lowrank",
                    doc="Optimus-CC's compressed backpropagation: each as a rank-`rank` P·Qᵀ",
                    params=(
                        _int("rank", "rank of the approximation", default="4", field="compress_pp_rank"),
                        Param(
                            name="lazy_error",
                            field="compress_pp_lazy_error",
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
            qualifies="compress_pp",
            doc="with compress_pp: the stages whose input gradient is sent back compressed, e.g. [2, 3]",
        ),
    ),
)
