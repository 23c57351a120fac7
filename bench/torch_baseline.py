"""The baseline of bench/throughput.py: the same GPT written with PyTorch's own APIs.

Single-device model code (nn.Linear, nn.Embedding), then either
``torch.distributed.tensor.parallel.parallelize_module`` with ColwiseParallel /
RowwiseParallel on q/k/v/o and the MLP (tp > 1), or ``DistributedDataParallel``
(dp > 1). Embedding and (tied) head stay replicated: DTensor cannot tie a
row-sharded embedding to a column-sharded head. Run with torchrun; rank 0 prints
one JSON line: {"tokens_per_s": median over the timed steps, ...}.

    torchrun --nproc-per-node 2 bench/torch_baseline.py --dp 2 --layers 6 ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.attn_norm = nn.LayerNorm(hidden)
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.o_proj = nn.Linear(hidden, hidden)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.up_proj = nn.Linear(hidden, ffn)
        self.down_proj = nn.Linear(ffn, hidden)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        # -1 heads: under TP the projections are local shards, so heads/tp of them.
        q = self.q_proj(h).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(B, T, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, -1))
        return x + self.down_proj(F.gelu(self.up_proj(self.mlp_norm(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, *, layers, hidden, heads, ffn, vocab, seq_len):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos_embed = nn.Embedding(seq_len, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, ffn) for _ in range(layers))
        self.final_norm = nn.LayerNorm(hidden)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.embed(tokens) + self.pos_embed(torch.arange(T))
        for layer in self.layers:
            x = layer(x)
        logits = self.final_norm(x) @ self.embed.weight.t()  # tied head
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def clip_grad_norm(model: nn.Module, max_norm: float) -> None:
    """Global-norm clipping that works on a mix of DTensor shards and plain tensors."""
    from torch.distributed.tensor import DTensor

    sharded = torch.zeros(())
    replicated = torch.zeros(())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for grad in grads:
        if isinstance(grad, DTensor):
            sharded += grad.to_local().pow(2).sum()
        else:
            replicated += grad.pow(2).sum()
    if dist.is_initialized() and sharded.item() != 0:
        dist.all_reduce(sharded)
    total = (sharded + replicated).sqrt()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for grad in grads:
        (grad.to_local() if isinstance(grad, DTensor) else grad).mul_(scale)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name, default in [("dp", 1), ("tp", 1), ("layers", 4), ("hidden", 128), ("heads", 4),
                          ("ffn", 512), ("vocab", 512), ("seq_len", 64), ("micro_batch", 2),
                          ("grad_accum", 1), ("steps", 8), ("warmup", 2)]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = GPT(layers=args.layers, hidden=args.hidden, heads=args.heads, ffn=args.ffn,
                vocab=args.vocab, seq_len=args.seq_len)
    if args.tp > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel, RowwiseParallel, parallelize_module)

        mesh = init_device_mesh("cpu", (args.tp,), mesh_dim_names=("tp",))
        plan = {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(), "v_proj": ColwiseParallel(),
                "o_proj": RowwiseParallel(), "up_proj": ColwiseParallel(), "down_proj": RowwiseParallel()}
        for layer in model.layers:
            parallelize_module(layer, mesh, plan)
    elif args.dp > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
    gen = torch.Generator().manual_seed(rank if args.dp > 1 else 0)
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        for _ in range(args.grad_accum):
            tokens = torch.randint(0, args.vocab, (args.micro_batch, args.seq_len + 1), generator=gen)
            loss = model(tokens[:, :-1], tokens[:, 1:]) / args.grad_accum
            loss.backward()
        clip_grad_norm(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if world > 1:
            dist.barrier()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    tokens_per_step = args.micro_batch * args.grad_accum * args.dp * args.seq_len
    if rank == 0:
        median = statistics.median(times)
        print(json.dumps({"tokens_per_s": tokens_per_step / median, "step_time_s": median}))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
