"""Every layout trains exactly like one rank (DESIGN §8).

For a tiny GPT and a tiny Llama, the generated trainer is built in each layout and
run with torchrun on CPU gloo in fp32 for 6 steps; every step's loss and the first
step's gradient norm must equal the single-rank build's within 1e-5 relative.

Six steps, as the issues ask of every layout: step 1's loss and gradient norm check the
forward and backward from the shared initialization; step 2's loss depends on step 1's
update of every parameter (clipping, AdamW from empty moments, the warmup LR); the later
steps compound updates with moments that have history, across the end of the warmup
(``cosine(warmup = 2)``) into the decay. The two steps past four cost little: a batch
launch's start-up, not its steps, is most of a trainer's time.

The trainers of every selected test run in one torchrun launch per world size
(tests/conftest.py's ``trainers``, Note [one launch, many trainers]); each layout stays
its own test, and a failing one shows its own logs.
"""

from __future__ import annotations

import math

import pytest

from .batch import Case
from .harness import layout_overrides

RTOL = 1e-5
STEPS = 6

LAYOUTS = {
    "tp2": dict(tp=2),
    "tp2-sp": dict(tp=2, sp=True),
    "dp2": dict(dp=2),
    "dp2-tp2": dict(dp=2, tp=2),
    "tp4": dict(tp=4),
    "dp4": dict(dp=4),
    "tp2-recompute-selective": dict(tp=2, parallel__recompute="selective"),
    "tp2-sp-recompute-full": dict(tp=2, sp=True, parallel__recompute="full"),
    "dp2-zero1": dict(dp=2, parallel__zero=1),
    "dp4-zero2": dict(dp=4, parallel__zero=2),
    "dp2-tp2-zero1": dict(dp=2, tp=2, parallel__zero=1),
    # sequence-parallel norms' grads are partial until summed over tp: ZeRO must wait
    "dp2-tp2-sp-zero1": dict(dp=2, tp=2, sp=True, parallel__zero=1),
    "dp2-tp2-sp-zero2": dict(dp=2, tp=2, sp=True, parallel__zero=2),
    # pipelines (DESIGN §7): every schedule, with tp, dp, sp, recompute and ZeRO
    "pp2-gpipe": dict(pp=2, parallel__schedule="gpipe"),
    "pp2-1f1b": dict(pp=2),
    "pp2-interleaved2": dict(pp=2, parallel__schedule="interleaved(chunks = 2)", model__layers=4),
    "pp4-1f1b": dict(pp=4, model__layers=4),
    "pp2-uneven-stages": dict(pp=2, parallel__stage_layers="[1, 3]", model__layers=4),
    # uneven virtual stages under an interleaved schedule: Llama 3 405B's layer fewer on the first and last
    "pp2-interleaved2-uneven": dict(pp=2, parallel__schedule="interleaved(chunks = 2)", model__layers=6,
                                    parallel__stage_layers="[1, 2, 2, 1]"),
    "pp2-tp2": dict(pp=2, tp=2),
    "pp2-tp2-sp": dict(pp=2, tp=2, sp=True),
    "pp2-dp2": dict(pp=2, dp=2),
    "pp2-recompute-selective": dict(pp=2, parallel__recompute="selective"),
    "pp2-recompute-full": dict(pp=2, parallel__recompute="full"),
    "pp2-dp2-zero2": dict(pp=2, dp=2, parallel__zero=2),
    "pp2-dp2-zero1": dict(pp=2, dp=2, parallel__zero=1),
    # zero_bubble (ZB-H1): backward split into B and W (runtime/parallel/pipeline/split_backward.py)
    "pp2-zero_bubble": dict(pp=2, parallel__schedule="zero_bubble"),
    "pp4-zero_bubble": dict(pp=4, parallel__schedule="zero_bubble", model__layers=4),
    "pp2-dp2-zero_bubble": dict(pp=2, dp=2, parallel__schedule="zero_bubble"),
    "pp2-tp2-zero_bubble": dict(pp=2, tp=2, parallel__schedule="zero_bubble"),
    "pp2-tp2-sp-zero_bubble": dict(pp=2, tp=2, sp=True, parallel__schedule="zero_bubble"),
    "pp2-dp2-zero2-zero_bubble": dict(pp=2, dp=2, parallel__zero=2, parallel__schedule="zero_bubble"),
    "pp2-recompute-full-zero_bubble": dict(pp=2, parallel__recompute="full", parallel__schedule="zero_bubble"),
    "pp2-recompute-selective-zero_bubble": dict(pp=2, parallel__recompute="selective", parallel__schedule="zero_bubble"),
    "pp2-tp2-overlap2-zero_bubble": dict(pp=2, tp=2, parallel__overlap="sub_batch(2)", parallel__schedule="zero_bubble"),
    "pp2-cp2-ulysses-zero_bubble": dict(pp=2, cp=2, parallel__cp_kind="ulysses", parallel__schedule="zero_bubble"),
    # zero_bubble_v (ZB-V): two chunks per rank in a V (runtime/layout/placement.py), rank 0 holds
    # the first and the last stage (the tied embedding's two copies summed in memory)
    "pp2-zero_bubble_v": dict(pp=2, parallel__schedule="zero_bubble_v", model__layers=4),
    "pp2-dp2-zero_bubble_v": dict(pp=2, dp=2, parallel__schedule="zero_bubble_v", model__layers=4),
    "pp2-tp2-zero_bubble_v": dict(pp=2, tp=2, parallel__schedule="zero_bubble_v", model__layers=4),
    # ZeRO-3 under the split backward: W regathers its block (fsdp.py, Note [ZeRO-3 under a split backward])
    "pp2-dp2-zero3-zero_bubble": dict(pp=2, dp=2, parallel__zero=3, parallel__schedule="zero_bubble"),
    "pp2-dp2-zero3-zero_bubble_v": dict(pp=2, dp=2, parallel__zero=3, parallel__schedule="zero_bubble_v",
                                        model__layers=4),
    # chimera: two pipelines in opposite directions, each stage held twice (ranks r and
    # p-1-r) with the replicas' gradients summed (runtime/layout/placement.py, model.py)
    "pp2-chimera": dict(pp=2, parallel__schedule="chimera"),
    "pp4-chimera": dict(pp=4, parallel__schedule="chimera", model__layers=4),
    "pp2-dp2-chimera": dict(pp=2, dp=2, parallel__schedule="chimera"),
    "pp2-tp2-chimera": dict(pp=2, tp=2, parallel__schedule="chimera"),
    "pp2-dp2-zero1-chimera": dict(pp=2, dp=2, parallel__zero=1, parallel__schedule="chimera"),
    "pp2-dp2-zero2-chimera": dict(pp=2, dp=2, parallel__zero=2, parallel__schedule="chimera"),
    # ZeRO-3 over stage replicas (fsdp.py): each replica's shards summed with its partner's
    "pp2-dp2-zero3-chimera": dict(pp=2, dp=2, parallel__zero=3, parallel__schedule="chimera"),
    # terapipe: each sequence in token slices, a slice attending to the earlier ones' keys
    # and values kept on its stage, backwards in reverse slice order (runtime/parallel/pipeline/terapipe.py)
    "pp2-terapipe2": dict(pp=2, parallel__schedule="terapipe(slices = 2)"),
    "pp2-terapipe4": dict(pp=2, parallel__schedule="terapipe(slices = 4)"),
    "pp2-dp2-terapipe2": dict(pp=2, dp=2, parallel__schedule="terapipe(slices = 2)"),
    "pp2-tp2-terapipe2": dict(pp=2, tp=2, parallel__schedule="terapipe(slices = 2)"),
    "pp2-dp2-zero2-terapipe2": dict(pp=2, dp=2, parallel__zero=2, parallel__schedule="terapipe(slices = 2)"),
    # uneven slices, as the paper's (seq_len 32): the kept keys and values of unequal slices
    "pp2-terapipe-uneven": dict(pp=2, parallel__schedule="terapipe(slices = [16, 8, 8])"),
    "pp2-dp2-terapipe-uneven": dict(pp=2, dp=2, parallel__schedule="terapipe(slices = [8, 16, 8])"),
    "pp2-tp2-terapipe-uneven": dict(pp=2, tp=2, parallel__schedule="terapipe(slices = [4, 12, 16])"),
    # under sp each tp rank holds its share of a slice (terapipe.py, Note [slices under sequence parallelism])
    "pp2-tp2-sp-terapipe-uneven": dict(pp=2, tp=2, sp=True, parallel__schedule="terapipe(slices = [12, 8, 12])"),
    # a slice's backward reruns its blocks (cores) against the kept keys (Note [recompute in a slice])
    "pp2-recompute-full-terapipe2": dict(pp=2, parallel__recompute="full", parallel__schedule="terapipe(slices = 2)"),
    # ZeRO-3: each block gathered around each slice's forward and backward, reduce-scattered per slice
    "pp2-dp2-zero3-terapipe2": dict(pp=2, dp=2, parallel__zero=3, parallel__schedule="terapipe(slices = 2)"),
    "pp2-recompute-selective-terapipe-uneven": dict(pp=2, parallel__recompute="selective",
                                                    parallel__schedule="terapipe(slices = [16, 8, 8])"),
    # Oases sub-batch overlap (runtime/parallel/tensor/overlap.py); dp > 1 layouts overlap gradients always
    "tp2-overlap2": dict(tp=2, parallel__overlap="sub_batch(2)"),
    "tp2-sp-overlap2": dict(tp=2, sp=True, parallel__overlap="sub_batch(2)"),
    "tp4-overlap2": dict(tp=4, parallel__overlap="sub_batch(2)"),
    "dp2-tp2-overlap2": dict(dp=2, tp=2, parallel__overlap="sub_batch(2)"),
    "tp2-sp-overlap2-recompute-full": dict(tp=2, sp=True, parallel__overlap="sub_batch(2)", parallel__recompute="full"),
    # ZeRO-3 in the wavefront (Note [module hooks in the wavefront]): each block gathered around its regions
    "dp2-tp2-zero3-overlap2": dict(dp=2, tp=2, parallel__zero=3, parallel__overlap="sub_batch(2)"),
    "dp2-tp2-sp-zero3-overlap2-recompute-full": dict(dp=2, tp=2, sp=True, parallel__zero=3,
                                                     parallel__overlap="sub_batch(2)", parallel__recompute="full"),
    "pp2-tp2-overlap2": dict(pp=2, tp=2, parallel__overlap="sub_batch(2)"),
    # per-layer layouts (Note [per-layer layout]): each block its own recompute / overlap
    "tp2-recompute-per-layer": dict(tp=2, model__layers=4, parallel__recompute="[full, none, selective, none]"),
    "tp2-sp-overlap-per-layer": dict(
        tp=2, sp=True, model__layers=4, parallel__overlap="[sub_batch(2), none, sub_batch(2), none]",
        parallel__recompute="[none, full, full, none]",
    ),
    "pp2-recompute-per-layer": dict(pp=2, model__layers=4, parallel__recompute="[full, selective, none, full]"),
    # context parallel (runtime/parallel/context/context.py): each rank holds T/cp tokens of every sequence
    "cp2-ulysses": dict(cp=2, parallel__cp_kind="ulysses"),
    "cp2-allgather": dict(cp=2, parallel__cp_kind="allgather"),
    "cp2-tp2-ulysses": dict(cp=2, tp=2, parallel__cp_kind="ulysses"),
    "dp2-cp2-allgather": dict(dp=2, cp=2, parallel__cp_kind="allgather"),
    "cp2-zero1": dict(dp=2, cp=2, parallel__cp_kind="ulysses", parallel__zero=1),
    # sequence parallel inside a cp rank: positions offset by the cp chunk and the tp shard
    "cp2-tp2-sp-allgather": dict(cp=2, tp=2, sp=True, parallel__cp_kind="allgather"),
    # pipeline stages hand each other (micro_batch, T/cp, hidden)
    "pp2-cp2-ulysses": dict(pp=2, cp=2, parallel__cp_kind="ulysses"),
    # selective recompute reruns the K/V gather in backward
    "cp2-allgather-recompute-selective": dict(cp=2, parallel__cp_kind="allgather", parallel__recompute="selective"),
    # Oases sub-batches split B: each sub-batch's attention does its own cp exchange
    "cp2-tp2-overlap2-allgather": dict(cp=2, tp=2, parallel__cp_kind="allgather", parallel__overlap="sub_batch(2)"),
    # ZeRO-3 (runtime/parallel/data/fsdp.py): blocks gathered before forward and backward, grads reduce-scattered
    "dp2-zero3": dict(dp=2, parallel__zero=3),
    "dp4-zero3": dict(dp=4, parallel__zero=3),
    "dp2-tp2-sp-zero3": dict(dp=2, tp=2, sp=True, parallel__zero=3),
    "pp2-dp2-zero3": dict(pp=2, dp=2, parallel__zero=3),
    "dp2-zero3-recompute-full": dict(dp=2, parallel__zero=3, parallel__recompute="full"),
    # HSDP: shard over the 2 dp ranks of a node, replicate over the 2 nodes (after the mesh keys)
    "dp4-zero3-node": dict(dp=4, parallel__zero=3, parallel__zero_shard="node", mesh__nodes=2,
                           mesh__devices_per_node=2),
    "dp2-zero3-prefetch2": dict(dp=2, model__layers=4, parallel__zero=3, parallel__zero_prefetch=2),
    "dp2-cp2-zero3": dict(dp=2, cp=2, parallel__cp_kind="allgather", parallel__zero=3),
    # two chunks per pipeline rank: each chunk's root and blocks are units of their own
    "pp2-dp2-interleaved2-zero3": dict(
        pp=2, dp=2, parallel__zero=3, parallel__schedule="interleaved(chunks = 2)", model__layers=4,
    ),
    # ring attention (runtime/parallel/context/ring.py): load-balanced chunks r and 2·cp−1−r, K/V around the ring
    "cp2-ring": dict(cp=2, parallel__cp_kind="ring"),
    "cp4-ring": dict(cp=4, parallel__cp_kind="ring"),
    "cp2-tp2-sp-ring": dict(cp=2, tp=2, sp=True, parallel__cp_kind="ring"),
    "dp2-cp2-ring": dict(dp=2, cp=2, parallel__cp_kind="ring"),
    "pp2-cp2-ring": dict(pp=2, cp=2, parallel__cp_kind="ring"),
    "cp2-ring-zero1": dict(dp=2, cp=2, parallel__cp_kind="ring", parallel__zero=1),
    "cp2-ring-recompute-full": dict(cp=2, parallel__cp_kind="ring", parallel__recompute="full"),
    "cp2-ring-recompute-selective": dict(cp=2, parallel__cp_kind="ring", parallel__recompute="selective"),
    "cp2-tp2-overlap2-ring": dict(cp=2, tp=2, parallel__cp_kind="ring", parallel__overlap="sub_batch(2)"),
    # tp > kv_heads: each kv head replicated over tp / kv_heads ranks (Note [KV replication])
    "tp4-kv-heads2": dict(tp=4, model__kv_heads=2),
    "tp4-sp-kv-heads2": dict(tp=4, sp=True, model__kv_heads=2),
    # where two features met at the merge: ring under ZeRO-3's gathers and zero_bubble's B/W split
    "dp2-cp2-ring-zero3": dict(dp=2, cp=2, parallel__cp_kind="ring", parallel__zero=3),
    "pp2-cp2-ring-zero_bubble": dict(pp=2, cp=2, parallel__cp_kind="ring", parallel__schedule="zero_bubble"),
    # heterogeneous layouts (runtime/parallel/data/hetero.py): each block its own tp × dp over the same ranks;
    # tp/dp give the coarse split (the ranks), the lists after them each block's
    "hetero-tp2211": dict(tp=2, model__layers=4, parallel__tp="[2, 2, 1, 1]", parallel__dp="[1, 1, 2, 2]"),
    "hetero-tp1221-sp": dict(tp=2, sp=True, model__layers=4, parallel__tp="[1, 2, 2, 1]",
                             parallel__dp="[2, 1, 1, 2]"),
    "hetero-tp2211-recompute": dict(tp=2, model__layers=4, parallel__tp="[2, 2, 1, 1]", parallel__dp="[1, 1, 2, 2]",
                                    parallel__recompute="[full, none, selective, full]"),
    "hetero-tp4224": dict(tp=4, model__layers=4, parallel__tp="[4, 2, 2, 4]", parallel__dp="[1, 2, 2, 1]"),
    # under a pipeline: each stage boundary at one degree (PAR0255), 2 layers a stage
    "hetero-pp2-tp2112": dict(tp=2, pp=2, model__layers=4, parallel__tp="[2, 1, 1, 2]", parallel__dp="[1, 2, 2, 1]"),
    "hetero-pp2-tp1221-sp": dict(tp=2, pp=2, sp=True, model__layers=4, parallel__tp="[1, 2, 2, 1]",
                                 parallel__dp="[2, 1, 1, 2]"),
    "hetero-dp2-tp2112": dict(dp=2, tp=2, model__layers=4, parallel__tp="[2, 1, 1, 2]", parallel__dp="[2, 4, 4, 2]"),
    # 2D tensor parallelism (Note [2D tensor parallelism] in runtime/parallel/tensor/layers2d.py): weights on an R × C grid
    "tp4-shape2x2": dict(tp=4, parallel__tp_shape="(2, 2)"),
    "tp2-shape2x1": dict(tp=2, parallel__tp_shape="(2, 1)"),
    "dp2-tp2-shape2x1-recompute-full": dict(dp=2, tp=2, parallel__tp_shape="(2, 1)", parallel__recompute="full"),
    "dp2-tp2-shape2x1-zero2": dict(dp=2, tp=2, parallel__tp_shape="(2, 1)", parallel__zero=2),
    "pp2-tp2-shape2x1": dict(pp=2, tp=2, parallel__tp_shape="(2, 1)"),
    # the 8-rank rows: the 2 × 2 grid with dp 2 and with pp 2
    "dp2-tp4-shape2x2": dict(dp=2, tp=4, parallel__tp_shape="(2, 2)"),
    "pp2-tp4-shape2x2": dict(pp=2, tp=4, parallel__tp_shape="(2, 2)"),
    # the grid's C, not tp, splits the heads (PAR0203): gpt's 4 heads over C = 2, tp 8 does not divide them
    "tp8-shape4x2": dict(tp=8, parallel__tp_shape="(4, 2)"),
    # Note [2D sequence parallelism]: the stream (B, T/C, hidden/R), reduce-scattered and
    # all-gathered over a row; (2, 1) splits no tokens, (1, 2) is 1D sp
    "tp4-shape2x2-sp": dict(tp=4, sp=True, parallel__tp_shape="(2, 2)"),
    "tp2-shape2x1-sp": dict(tp=2, sp=True, parallel__tp_shape="(2, 1)"),
    "tp2-shape1x2-sp": dict(tp=2, sp=True, parallel__tp_shape="(1, 2)"),
    # stages hand each other (B, T/C, hidden/R): the only row that splits tokens at a boundary
    "pp2-tp4-shape2x2-sp": dict(pp=2, tp=4, sp=True, parallel__tp_shape="(2, 2)"),
    # ZeRO-3 over the 2D shards: units of the grid's boxes, partly replicated values 1/k in the norm
    "dp2-tp2-shape2x1-zero3": dict(dp=2, tp=2, parallel__tp_shape="(2, 1)", parallel__zero=3),
    # ZeRO-1 (hetero.ShardedAdamW): each layer's moments sliced over its own dp group
    "hetero-tp2211-zero1": dict(tp=2, model__layers=4, parallel__tp="[2, 2, 1, 1]", parallel__dp="[1, 1, 2, 2]",
                                parallel__zero=1),
    # ... under a pipeline with sp: the tied table's stage copy and the sp-summed norms in the slices
    "hetero-pp2-tp1221-sp-zero1": dict(tp=2, pp=2, sp=True, model__layers=4, parallel__tp="[1, 2, 2, 1]",
                                       parallel__dp="[2, 1, 1, 2]", parallel__zero=1),
    # ZeRO-2: each layer's buckets into its slices; dp groups of 2 and 4, divided by the coarse dp 2
    "hetero-dp2-tp2112-zero2": dict(dp=2, tp=2, model__layers=4, parallel__tp="[2, 1, 1, 2]",
                                    parallel__dp="[2, 4, 4, 2]", parallel__zero=2),
    # ZeRO-3 (fsdp.py, Note [ZeRO-3 over per-layer layouts]): each block's unit over its own layer's dp group;
    # untied, the embedding (tp 2) and the head (tp 1) are two root units over two dp groups
    "hetero-tp2211-zero3-untied": dict(tp=2, model__layers=4, model__tie_embeddings="false",
                                       parallel__tp="[2, 2, 1, 1]", parallel__dp="[1, 1, 2, 2]", parallel__zero=3),
    # ... the other way round: the head at tp 2 is vocab-parallel by its own degree's plan
    "hetero-tp1122-zero3-untied": dict(tp=2, model__layers=4, model__tie_embeddings="false",
                                       parallel__tp="[1, 1, 2, 2]", parallel__dp="[2, 2, 1, 1]", parallel__zero=3),
    # ... under a pipeline (2 layers a stage) with sp: the tied head's stage copy, the sp-summed norms'
    # late units (reduced after their sum over each layer's tp group)
    "hetero-pp2-tp2112-sp-zero3": dict(tp=2, pp=2, sp=True, model__layers=4, parallel__tp="[2, 1, 1, 2]",
                                       parallel__dp="[1, 2, 2, 1]", parallel__zero=3),
    # sub-batch overlap (overlap.py) on the tp-2 blocks, their own tp group; the tp-1 blocks run unsplit
    "hetero-tp2211-overlap2": dict(tp=2, model__layers=4, parallel__tp="[2, 2, 1, 1]", parallel__dp="[1, 1, 2, 2]",
                                   parallel__overlap="sub_batch(2)"),
    # ... per layer, under sp: the embedding at tp 1, so the run's tp group is not the model's
    "hetero-tp1221-sp-overlap": dict(tp=2, sp=True, model__layers=4, parallel__tp="[1, 2, 2, 1]",
                                     parallel__dp="[2, 1, 1, 2]", parallel__overlap="[none, sub_batch(2), sub_batch(2), none]"),
}
ARCHS = ("gpt", "llama")

MOE = dict(model__experts=4, model__top_k=2)
"""A tiny llama with 4 experts, top-2 (runtime/parallel/expert/moe.py), every block MoE unless a row says."""
DEEPSEEK = dict(model__first_dense_layers=1, model__router="sigmoid", model__router_bias_update=0.05,
                model__aux_loss_scope="sequence")
MOE_LAYOUTS = {
    # experts replicated (ep = 1): every layout routes each token as one rank does
    "dp2": dict(dp=2),
    "tp2": dict(tp=2),
    "dp2-tp2-zero1": dict(dp=2, tp=2, parallel__zero=1),
    "pp2": dict(pp=2),
    "dp2-zero2": dict(dp=2, parallel__zero=2),
    "tp2-recompute-full": dict(tp=2, parallel__recompute="full"),
    "dp2-shared1-every2": dict(dp=2, model__shared_experts=1, model__moe_every=2),
    "dp2-capacity-zloss": dict(dp=2, model__capacity_factor=1.0, model__z_loss=0.001),
    # expert parallelism (Note [expert dispatch]): experts split over ranks, tokens all-to-all
    "ep2": dict(dp=2, parallel__ep=2),
    "ep2-pp2": dict(dp=2, pp=2, parallel__ep=2),
    "ep2-dp4": dict(dp=4, parallel__ep=2),  # edp 2: expert grads also reduce over edp
    "ep4-dp4": dict(dp=4, parallel__ep=4),
    "ep2-shared1-every2": dict(dp=2, parallel__ep=2, model__shared_experts=1, model__moe_every=2),
    # Note [expert dispatch under tp]: ep folds dp·tp; each tp rank dispatches a share of the tokens
    "ep4-dp2-tp2": dict(dp=2, tp=2, parallel__ep=4),
    "ep2-dp2-tp2-overlap2": dict(dp=2, tp=2, parallel__ep=2, parallel__overlap="sub_batch(2)"),
    # Note [expert all-to-all overlap]: sub-batch i+1's dispatch runs behind i's experts
    "ep2-overlap2": dict(dp=2, parallel__ep=2, parallel__overlap="sub_batch(2)"),
    "ep2-pp2-overlap2-every2": dict(dp=2, pp=2, parallel__ep=2, parallel__overlap="sub_batch(2)",
                                    model__moe_every=2),
    # Note [capacity under sequence parallelism]: the drop ranking of the whole micro-batch
    # under sp, each tp rank keeping its shard's part: what one rank drops
    "tp2-sp-capacity": dict(tp=2, sp=True, model__capacity_factor=1.0),
    # ... under ring cp each rank's two load-balanced chunks, and with sp a tp rank's shard of them
    "cp2-ring-capacity": dict(cp=2, parallel__cp_kind="ring", model__capacity_factor=1.0),
    "cp2-ring-tp2-sp-capacity": dict(cp=2, parallel__cp_kind="ring", tp=2, sp=True, model__capacity_factor=1.0),
    "ep2-capacity-recompute-full": dict(dp=2, parallel__ep=2, model__capacity_factor=1.0,
                                        parallel__recompute="full"),
    # TeraPipe (terapipe.py, Note [experts in a slice]): each slice routed as it comes, the balance
    # loss's gradient the micro-batch's (deferred to the last slice); under sp each tp rank its share
    "pp2-terapipe-uneven": dict(pp=2, parallel__schedule="terapipe(slices = [16, 8, 8])"),
    "gpt-pp2-tp2-sp-terapipe2-zloss": dict(arch="gpt", pp=2, tp=2, sp=True, model__z_loss=0.001,
                                          parallel__schedule="terapipe(slices = 2)"),
    "ep2-pp2-terapipe2": dict(dp=2, pp=2, parallel__ep=2, parallel__schedule="terapipe(slices = 2)"),
    # where features met at the merge: experts under ZeRO-3's units and zero_bubble's B/W split
    "dp2-zero3": dict(dp=2, parallel__zero=3),
    "pp2-zero_bubble": dict(pp=2, parallel__schedule="zero_bubble"),
    "ep2-pp2-zero_bubble": dict(dp=2, pp=2, parallel__ep=2, parallel__schedule="zero_bubble"),
    # Note [experts under ZeRO]: the experts' flat buffer is sharded over edp, the rest over dp
    "ep2-zero1": dict(dp=2, parallel__ep=2, parallel__zero=1),
    "ep2-dp4-zero2": dict(dp=4, parallel__ep=2, parallel__zero=2),  # edp 2: expert slices too
    # Note [expert tensor parallelism]: each expert's ffn split over etp, rows gathered and
    # partial outputs reduce-scattered over the etp group
    "etp2-tp2": dict(tp=2, parallel__etp=2),
    "gpt-etp2-tp2": dict(arch="gpt", tp=2, parallel__etp=2),  # gelu experts, one up/down pair
    "ep2-etp2-dp2-tp2": dict(dp=2, tp=2, parallel__ep=2, parallel__etp=2),
    "etp2-dp2": dict(dp=2, parallel__etp=2),  # etp across dp ranks: different tokens, gathered
    "etp2-tp2-pp2": dict(tp=2, pp=2, parallel__etp=2),  # each stage its own expert groups
    "ep2-etp2-dp2-tp2-zero1-overlap2": dict(dp=2, tp=2, parallel__ep=2, parallel__etp=2, parallel__zero=1,
                                            parallel__overlap="sub_batch(2)"),
    # Note [MoE under sequence parallelism]: each tp rank routes its sequence shard; the aux
    # and z losses are the micro-batch's (z on, so its reduction is checked too)
    "tp2-sp-zloss": dict(tp=2, sp=True, model__z_loss=0.001),
    "ep2-tp2-sp": dict(tp=2, sp=True, parallel__ep=2),
    "ep2-etp2-dp2-tp2-sp-shared1": dict(dp=2, tp=2, sp=True, parallel__ep=2, parallel__etp=2,
                                        model__shared_experts=1),
    "gpt-tp2-sp-zero1": dict(arch="gpt", dp=2, tp=2, sp=True, parallel__zero=1),
    # Note [experts as units] (fsdp.py): under ZeRO-3 the experts are units of their own over edp
    "ep2-zero3": dict(dp=2, parallel__ep=2, parallel__zero=3),
    "ep2-dp4-zero3": dict(dp=4, parallel__ep=2, parallel__zero=3),  # edp 2: expert shards too
    # ... under zero_shard = node (HSDP, 2 "nodes" of 2): the dense units over a node's dp ranks,
    # the experts' over its edp ranks (here 1: whole), both summed over the other node once a step
    "ep2-dp4-zero3-node": dict(dp=4, parallel__ep=2, parallel__zero=3, parallel__zero_shard="node", mesh__nodes=2,
                               mesh__devices_per_node=2),
    "gpt-ep2-dp4-zero3-node": dict(arch="gpt", dp=4, parallel__ep=2, parallel__zero=3, parallel__zero_shard="node",
                                   mesh__nodes=2, mesh__devices_per_node=2),
    "ep2-etp2-dp2-tp2-sp-zero3-recompute-full": dict(dp=2, tp=2, sp=True, parallel__ep=2, parallel__etp=2,
                                                     parallel__zero=3, parallel__recompute="full"),
    # Note [MoE under context parallelism] (moe.py): each cp rank routes its chunk, the aux
    # and z losses are the micro-batch's (summed over cp), ep and edp fold dp·cp·tp
    "cp2-ring-zloss": dict(cp=2, parallel__cp_kind="ring", model__z_loss=0.001),
    "gpt-cp2-ulysses-ep2": dict(arch="gpt", cp=2, parallel__cp_kind="ulysses", parallel__ep=2),
    "dp2-cp2-ep2-zero1": dict(dp=2, cp=2, parallel__cp_kind="allgather", parallel__ep=2, parallel__zero=1),
    "cp2-tp2-sp-ep2-etp2": dict(cp=2, tp=2, sp=True, parallel__cp_kind="ring", parallel__ep=2, parallel__etp=2),
    # DeepSeek-style (router_bias.py, Note [auxiliary-loss-free balancing]): block 0 dense, a sigmoid
    # router whose biases move after each step from the loads over every rank, the balance loss per
    # sequence (summed over the ranks that split one under sp); one reference run
    "ep2-deepseek": dict(dp=2, parallel__ep=2, **DEEPSEEK),
    "ep2-pp2-deepseek": dict(dp=2, pp=2, parallel__ep=2, **DEEPSEEK),
    "tp2-sp-deepseek": dict(tp=2, sp=True, **DEEPSEEK),
}
"""Every step's loss, aux_loss (z_loss) and expert_tokens, and the first grad norm, vs one rank
(the tiny llama unless a row says ``arch="gpt"``)."""


GRAD_REDUCE_BF16 = {"gpt": dict(dp=2, parallel__zero=1, train__grad_reduce="bf16"),
                    "llama": dict(dp=2, parallel__zero=3, train__grad_reduce="bf16")}
"""zero.py's Note [bf16 reduction under ZeRO]: not exact (the sums round), so in no table: the
step-1 loss is one rank's (its forward precedes every update), the step-1 gradient norm is
within ``GRAD_NORM_BF16`` of one rank's, and the loss falls, finite."""
GRAD_NORM_BF16 = 1e-2
"""bf16 keeps 8 significant bits: a rank's gradient and the sum are each rounded once, at
most 2^-9 of the value each; the norm's error ≤ 2^-8 of the norms summed, about 0.4-0.8%
where the ranks' gradients do not cancel (tests/runtime/test_grad_reduce_zero.py derives it)."""


DOCUMENTS = dict(model__documents="separate")
"""``model.documents = separate`` (runtime/models/documents.py): attention and positions within
each of the synthetic data's documents (about four a sequence: Note [documents of a sample])."""
DOCUMENT_LAYOUTS = {
    # learned positions from each document's start, each sp shard at its own tokens' positions
    "gpt-tp2-sp": dict(tp=2, sp=True),
    # learned positions at the cp rank's spans, the keys gathered and masked by document
    "gpt-cp2-allgather": dict(cp=2, parallel__cp_kind="allgather"),
    # rotary within documents at the rank's two load-balanced chunks, each ring block masked;
    # eval reads the documents of its own stream too
    "llama-cp2-ring": dict(cp=2, parallel__cp_kind="ring"),
    # the ids reach the second stage's blocks; a slice's queries against the kept keys, rotary
    # from the document starts at the slice's positions
    "llama-pp2-terapipe2": dict(pp=2, parallel__schedule="terapipe(slices = 2)"),
    # ... and under the default 1F1B, each micro-batch's ids set again before each stage's action
    "gpt-pp2": dict(pp=2),
}
"""Document separation in each attention path, vs one rank with documents = separate (the
references evaluate, as ``EVALUATED``'s do)."""


def documents_case(name: str) -> Case:
    arch, layout = name.split("-", 1)
    overrides = tuple(layout_overrides(**DOCUMENT_LAYOUTS[name], **DOCUMENTS))
    return Case(f"{arch}-documents-{layout}", f"{arch}.par", overrides + (EVAL if "cp2-ring" in name else ()),
                nproc_of(DOCUMENT_LAYOUTS[name]), ("--steps", str(STEPS)))


def documents_reference_case(arch: str) -> Case:
    return Case(f"{arch}-documents-single", f"{arch}.par", tuple(layout_overrides(**DOCUMENTS)) + EVAL, 1,
                ("--steps", str(STEPS)))


TRAITS = dict(model__head_dim=12, model__qk_norm="true", model__attention_bias="true",
              train__optimizer="adamw(lr = 1e-2, betas = (0.9, 0.95), weight_decay = 0.1)")
"""Current open models' attention (issue 35): heads of 12 on hidden 64 with 8 heads (not
hidden / heads), Qwen3's q/k RMSNorm and Qwen2's q/k/v biases, all on in one llama. lr 1e-2,
not the spec's 1e-3: the head norms' weights then move enough that leaving their gradients
partial over tp (each rank's heads only) shifts step 3's loss by 4e-5 of it (measured), past
RTOL, where at 1e-3 it stayed under it; the right run stays within 1e-7."""
TRAIT_LAYOUTS = {
    # heads·head_dim split over tp, the column biases with their rows, the head norms' grads summed over tp
    "tp2": dict(tp=2),
    "tp2-sp": dict(tp=2, sp=True),
    # the head norms on the rank's two load-balanced chunks, rotary of head_dim at their positions
    "cp2-ring": dict(cp=2, parallel__cp_kind="ring"),
    "pp2-1f1b": dict(pp=2),
}


def traits_case(layout: str) -> Case:
    degrees = TRAIT_LAYOUTS[layout]
    return Case(f"llama-traits-{layout}", "llama.par", tuple(layout_overrides(**degrees, **TRAITS)),
                nproc_of(degrees), ("--steps", str(STEPS)))


def traits_reference_case() -> Case:
    return Case("llama-traits-single", "llama.par", tuple(layout_overrides(**TRAITS)), 1, ("--steps", str(STEPS)))


def model_overrides(degrees: dict) -> dict:
    """The ``model__*`` entries of a layout: the single-rank reference must share them."""
    return {key: value for key, value in degrees.items() if key.startswith("model__")}


def nproc_of(degrees: dict) -> int:
    return degrees.get("dp", 1) * degrees.get("cp", 1) * degrees.get("tp", 1) * degrees.get("pp", 1)


EVAL = ("train.eval=every(2, batches = 2)",)
EVALUATED = ("dp2", "tp2", "pp2-1f1b", "cp2-ulysses", "cp2-ring", "dp2-tp2")
"""Note [one meaning of val_loss]: these layouts' runs, and the plain reference, also evaluate
(``train.eval``: steps 2, 4 and 6, two batches each), and their val_loss must equal one rank's
as the training losses do. Evaluation reads its own stream and draws nothing from training's,
so every other layout's losses still equal this reference's: that is checked too."""


def layout_case(arch: str, layout: str) -> Case:
    degrees = LAYOUTS[layout]
    overrides = tuple(layout_overrides(**degrees)) + (EVAL if layout in EVALUATED else ())
    return Case(f"{arch}-{layout}", f"{arch}.par", overrides, nproc_of(degrees), ("--steps", str(STEPS)))


def reference_case(arch: str, model: dict | None = None) -> Case:
    """The single-rank run of ``arch`` (with a layout's model variant, e.g. 4 layers)."""
    model = model or {}
    words = "".join(f"-{key.removeprefix('model__')}{value}" for key, value in sorted(model.items()))
    overrides = tuple(layout_overrides(**model)) + (() if model else EVAL)
    return Case(f"{arch}-single{words}", f"{arch}.par", overrides, 1, ("--steps", str(STEPS)))


def moe_row(layout: str) -> tuple[str, dict]:
    """The spec file and the ``--set`` degrees of a MOE_LAYOUTS row."""
    degrees = {**MOE, **MOE_LAYOUTS[layout]}
    return f"{degrees.pop('arch', 'llama')}.par", degrees


def moe_case(layout: str) -> Case:
    spec, degrees = moe_row(layout)
    overrides = tuple(layout_overrides(**degrees))
    return Case(f"{spec[:-4]}-moe-{layout}", spec, overrides, nproc_of(degrees), ("--steps", str(STEPS)))


def moe_reference_case(layout: str) -> Case:
    spec, degrees = moe_row(layout)
    model = model_overrides(degrees)
    words = "".join(f"-{key.removeprefix('model__')}{value}" for key, value in sorted(model.items()))
    return Case(f"{spec[:-4]}-moe-single{words}", spec, tuple(layout_overrides(**model)), 1,
                ("--steps", str(STEPS)))


def grad_reduce_case(arch: str) -> Case:
    degrees = GRAD_REDUCE_BF16[arch]
    return Case(f"{arch}-dp2-zero{degrees['parallel__zero']}-grad_reduce_bf16", f"{arch}.par",
                tuple(layout_overrides(**degrees)), nproc_of(degrees), ("--steps", str(STEPS)))


def cases_of(item) -> list[Case]:
    """The runs a selected test of this module reads (tests/conftest.py's ``trainers``)."""
    if item.originalname == "test_grad_reduce_bf16_under_zero_trains":
        return [grad_reduce_case(item.callspec.params["arch"]), reference_case(item.callspec.params["arch"])]
    if item.originalname == "test_moe_layout_matches_single_rank":
        layout = item.callspec.params["layout"]
        return [moe_case(layout), moe_reference_case(layout)]
    if item.originalname == "test_layout_matches_single_rank":
        arch, layout = item.callspec.params["arch"], item.callspec.params["layout"]
        return [layout_case(arch, layout), reference_case(arch, model_overrides(LAYOUTS[layout]))]
    if item.originalname == "test_documents_match_single_rank":
        name = item.callspec.params["name"]
        return [documents_case(name), documents_reference_case(name.split("-")[0])]
    if item.originalname == "test_traits_match_single_rank":
        return [traits_case(item.callspec.params["layout"]), traits_reference_case()]
    if item.originalname == "test_single_rank_loss_falls":
        return [reference_case(arch) for arch in ARCHS]
    return []


def assert_close(actual: float, expected: float, what: str) -> None:
    assert math.isfinite(actual), f"{what}: {actual} is not finite"
    assert abs(actual - expected) <= RTOL * abs(expected), (
        f"{what}: {actual!r} vs single-rank {expected!r} "
        f"(relative difference {abs(actual - expected) / abs(expected):.3g} > {RTOL})"
    )


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_single_rank(arch, layout, trainers):
    runs = trainers.records(layout_case(arch, layout))
    expected = trainers.records(reference_case(arch, model_overrides(LAYOUTS[layout])))
    assert [r["step"] for r in runs] == [r["step"] for r in expected] == list(range(1, STEPS + 1))
    for got, want in zip(runs, expected):
        assert_close(got["loss"], want["loss"], f"{arch} {layout} step {got['step']} loss")
    assert_close(runs[0]["grad_norm"], expected[0]["grad_norm"], f"{arch} {layout} step 1 grad_norm")
    if layout in EVALUATED:  # Note [one meaning of val_loss]
        evaluated = [r["step"] for r in expected if r.get("val_loss") is not None]
        assert evaluated == [2, 4, 6]
        assert [r["step"] for r in runs if r.get("val_loss") is not None] == evaluated
        for got, want in zip(runs, expected):
            if want.get("val_loss") is not None:
                assert_close(got["val_loss"], want["val_loss"], f"{arch} {layout} step {got['step']} val_loss")
                assert got["val_loss"] != got["loss"]  # another stream than training's


@pytest.mark.parametrize("name", list(DOCUMENT_LAYOUTS))
def test_documents_match_single_rank(name, trainers):
    """Every step's loss and the first grad norm of a layout under documents = separate
    equal one rank's (a different run from joined's: tests/runtime/test_documents.py)."""
    arch = name.split("-")[0]
    runs, expected = trainers.records(documents_case(name)), trainers.records(documents_reference_case(arch))
    assert [r["step"] for r in runs] == [r["step"] for r in expected] == list(range(1, STEPS + 1))
    for got, want in zip(runs, expected):
        assert_close(got["loss"], want["loss"], f"documents {name} step {got['step']} loss")
        if got.get("val_loss") is not None:
            assert_close(got["val_loss"], want["val_loss"], f"documents {name} step {got['step']} val_loss")
    assert_close(runs[0]["grad_norm"], expected[0]["grad_norm"], f"documents {name} step 1 grad_norm")
    assert "cp2-ring" not in name or [r["step"] for r in runs if r.get("val_loss") is not None] == [2, 4, 6]


@pytest.mark.parametrize("layout", list(TRAIT_LAYOUTS))
def test_traits_match_single_rank(layout, trainers):
    """head_dim ≠ hidden / heads, qk_norm and attention_bias together: every step's loss and
    the first grad norm equal one rank's."""
    runs, expected = trainers.records(traits_case(layout)), trainers.records(traits_reference_case())
    assert [r["step"] for r in runs] == [r["step"] for r in expected] == list(range(1, STEPS + 1))
    for got, want in zip(runs, expected):
        assert_close(got["loss"], want["loss"], f"traits {layout} step {got['step']} loss")
    assert_close(runs[0]["grad_norm"], expected[0]["grad_norm"], f"traits {layout} step 1 grad_norm")


def test_single_rank_loss_falls(trainers):
    for arch in ARCHS:
        runs = trainers.records(reference_case(arch))
        assert runs[-1]["loss"] < runs[0]["loss"], f"{arch}: loss did not fall: {[r['loss'] for r in runs]}"


@pytest.mark.parametrize("layout", list(MOE_LAYOUTS))
def test_moe_layout_matches_single_rank(layout, trainers):
    runs = trainers.records(moe_case(layout))
    expected = trainers.records(moe_reference_case(layout))
    assert [r["step"] for r in runs] == [r["step"] for r in expected] == list(range(1, STEPS + 1))
    for got, want in zip(runs, expected):
        for key in ("loss", "aux_loss", "z_loss"):
            assert (key in got) == (key in want)
            if key in want:
                assert_close(got[key], want[key], f"moe {layout} step {got['step']} {key}")
        # routing is exact: the tokens each expert got, summed over ranks, are one rank's
        assert got["expert_tokens"] == want["expert_tokens"], f"moe {layout} step {got['step']} expert_tokens"
    assert_close(runs[0]["grad_norm"], expected[0]["grad_norm"], f"moe {layout} step 1 grad_norm")


@pytest.mark.parametrize("arch", ARCHS)
def test_grad_reduce_bf16_under_zero_trains(arch, trainers):
    """``GRAD_REDUCE_BF16``: ZeRO with its reductions in bf16 trains as one rank does, up to
    bf16's rounding of the gradient sums."""
    runs = trainers.records(grad_reduce_case(arch))
    expected = trainers.records(reference_case(arch))
    assert [r["step"] for r in runs] == list(range(1, STEPS + 1))
    assert_close(runs[0]["loss"], expected[0]["loss"], f"{arch} grad_reduce = bf16 step 1 loss")
    got, want = runs[0]["grad_norm"], expected[0]["grad_norm"]
    assert abs(got - want) <= GRAD_NORM_BF16 * want, f"{arch} step 1 grad_norm {got!r} vs single-rank {want!r}"
    assert all(math.isfinite(r["loss"]) for r in runs)
    assert runs[-1]["loss"] < runs[0]["loss"], f"{arch}: loss did not fall: {[r['loss'] for r in runs]}"
