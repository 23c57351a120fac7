"""A minimal training loop over the runtime, the steps the generated train.py takes.

Used in-process for the single-rank reference and by ``rank_worker.py`` in every
rank of a multi-rank layout. sample_indices → batch → loss / grad_accum → backward →
SP grad sync → dp buckets → clip → lr → AdamW step, for a tiny GPT and Llama.
"""

from __future__ import annotations

import torch

from parc.runtime.train import data
from parc.runtime.parallel.data import dp
from parc.runtime.distributed import mesh
from parc.runtime.models import model
from parc.runtime.optimizers import optim
import built  # noqa: E402  (tests/runtime/built.py)

TINY = dict(layers=2, hidden=64, ffn=128, vocab=250, padded_vocab=256, seq_len=32)
CONFIGS = {
    # vocab 250 of 256: the padding columns must stay out of the softmax on every shard.
    "gpt": model.ModelConfig(arch="gpt", heads=4, kv_heads=4, tie_embeddings=True, **TINY),
    # 8 heads over 4 kv heads: grouped-query attention that tp = 4 still splits.
    "llama": model.ModelConfig(arch="llama", heads=8, kv_heads=4, tie_embeddings=False, **TINY),
}

# The table codegen writes into train.py (codegen/passes/partition_layers.py).
_BLOCKS = {
    "layers.*.attn.q_proj": "colwise",
    "layers.*.attn.k_proj": "colwise",
    "layers.*.attn.v_proj": "colwise",
    "layers.*.attn.o_proj": "rowwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}


def tp_plan(arch: str, *, replicated_ends: bool = False) -> dict[str, str]:
    """The full plan, or (``replicated_ends``) one that leaves embed and head whole."""
    plan = {} if replicated_ends else {"embed": "vocab", "head": "vocab_head"}
    plan.update(_BLOCKS)
    if arch == "llama":
        plan["layers.*.mlp.gate_proj"] = "colwise"
    return plan


# name → (dp, tp, sequence_parallel, replicated_ends); grouped by world size per launch.
LAYOUTS = {
    "tp2": (1, 2, False, False),
    "tp2-sp": (1, 2, True, False),
    "dp2": (2, 1, False, False),
    "tp2-sp-replicated-ends": (1, 2, True, True),
    "dp2-tp2": (2, 2, False, False),
    "tp4": (1, 4, False, False),
    "dp2-tp2-sp": (2, 2, True, False),
}


def single_rank() -> mesh.Dist:
    return mesh.Dist(0, 1, 0, torch.device("cpu"), None)


def train(arch, dist_info, *, dp_size=1, tp_size=1, sp=False, replicated_ends=False, steps=3,
          peak_lr=1e-3, global_batch=8, micro_batch=2, seed=3) -> dict:
    """Train ``steps`` steps; per step (loss, grad norm), then the loss on the next batch."""
    grid = mesh.Mesh((("dp", dp_size), ("tp", tp_size)), dist_info)
    tp_group, dp_group = grid.group("tp"), grid.group("dp")
    config = CONFIGS[arch]
    net = built.build(config, tp_group=tp_group, sequence_parallel=sp,
                            tp_plan=tp_plan(arch, replicated_ends=replicated_ends) if tp_size > 1 else {},
                            seed=seed, device=dist_info.device)
    opt = optim.build_optimizer(net, lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    buckets = dp.GradientBuckets(net, dp_group, bucket_bytes=16384)  # several buckets
    dataset = data.SyntheticTokens(config.vocab, config.seq_len, seed=5)
    grad_accum = global_batch // (micro_batch * dp_size)

    def batch(step, micro):
        indices = data.sample_indices(step, micro, micro_batch=micro_batch, grad_accum=grad_accum,
                                      dp_rank=grid.index("dp"), dp_size=dp_size)
        return dataset.batch(indices)

    records = []
    for step in range(1, steps + 1):
        lr = optim.lr_at(step, kind="cosine", peak_lr=peak_lr, warmup=1, total_steps=steps,
                         min_lr_ratio=0.1)
        optim.set_lr(opt, lr)
        loss_sum = 0.0
        for micro in range(grad_accum):
            loss = net(*batch(step, micro)) / grad_accum
            loss.backward()
            loss_sum += loss.item()
        if sp:
            model.allreduce_sequence_parallel_grads(net, tp_group)
        buckets.all_reduce()
        norm = optim.clip_grad_norm_(net, 0.5, tp_group=tp_group)
        opt.step()
        opt.zero_grad(set_to_none=True)
        records.append((dp.all_reduce_mean(loss_sum, dp_group), norm))
    with torch.no_grad():  # the effect of the last update, too
        after = sum(net(*batch(steps + 1, m)).item() for m in range(grad_accum)) / grad_accum
    return {
        "steps": records,
        "final_loss": dp.all_reduce_mean(after, dp_group),
        "names": [name for name, _ in net.named_parameters()],
    }
