"""A minimal training loop over the runtime, run in each rank by the runtime tests.

The same steps the generated train.py takes, without the generator in between, so a
runtime bug shows up here first.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from parc.runtime import data, dp, mesh, model, optim

TINY = dict(layers=2, hidden=64, ffn=128, vocab=250, padded_vocab=256, seq_len=32)
PLANS = {
    "gpt": {
        "embed": "vocab", "head": "vocab_head",
        "layers.*.attn.q_proj": "colwise", "layers.*.attn.k_proj": "colwise",
        "layers.*.attn.v_proj": "colwise", "layers.*.attn.o_proj": "rowwise",
        "layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise",
    },
}
PLANS["llama"] = dict(PLANS["gpt"], **{"layers.*.mlp.gate_proj": "colwise"})


def train(arch: str, dp_size: int, tp_size: int, sp: bool, steps: int = 3) -> list[tuple[float, float]]:
    dist_info = mesh.init_distributed()
    grid = mesh.Mesh((("dp", dp_size), ("tp", tp_size)), dist_info)
    tp_group, dp_group = grid.group("tp"), grid.group("dp")
    config = model.ModelConfig(arch=arch, heads=8 if arch == "llama" else 4, kv_heads=4,
                               tie_embeddings=arch == "gpt", **TINY)
    net = model.build_model(config, tp_group=tp_group, sequence_parallel=sp,
                            tp_plan=PLANS[arch], seed=3, device=dist_info.device)
    opt = optim.build_optimizer(net, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    buckets = dp.GradientBuckets(net, dp_group, bucket_bytes=4096)
    dataset = data.SyntheticTokens(config.vocab, config.seq_len, seed=5)
    global_batch, micro_batch = 8, 2
    grad_accum = global_batch // (micro_batch * dp_size)
    out = []
    for step in range(1, steps + 1):
        total = 0.0
        for micro in range(grad_accum):
            idx = data.sample_indices(step, micro, micro_batch=micro_batch, grad_accum=grad_accum,
                                      dp_rank=grid.index("dp"), dp_size=dp_size)
            inputs, targets = dataset.batch(idx)
            loss = net(inputs, targets) / grad_accum
            loss.backward()
            total += loss.item()
        if sp:
            model.allreduce_sequence_parallel_grads(net, tp_group)
        buckets.all_reduce()
        norm = optim.clip_grad_norm_(net, 1.0, tp_group=tp_group)
        optim.set_lr(opt, optim.lr_at(step, kind="cosine", peak_lr=1e-3, warmup=1, total_steps=steps, min_lr_ratio=0.1))
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append((dp.all_reduce_mean(total, dp_group), norm))
    mesh.shutdown()
    return out


if __name__ == "__main__":
    arch, dp_size, tp_size, sp, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
    result = train(arch, dp_size, tp_size, sp)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(path, "w") as f:
            json.dump(result, f)
