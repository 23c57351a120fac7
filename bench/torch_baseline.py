"""The baseline of bench/throughput.py: the same GPT written with PyTorch's own APIs.

Single-device model code (nn.Linear, nn.Embedding), then either
``torch.distributed.tensor.parallel.parallelize_module`` with ColwiseParallel /
RowwiseParallel on q/k/v/o and the MLP (tp > 1), or ``DistributedDataParallel``
(dp > 1). Embedding and (tied) head stay replicated: DTensor cannot tie a
row-sharded embedding to a column-sharded head. Run with torchrun; rank 0 prints
one JSON line: {"tokens_per_s": median over the timed steps, ...}.

``--arch llama`` is the plain PyTorch Llama of bench/gpu_acceptance.sh, one device:
RMSNorm, rotary embeddings, grouped-query attention through
``F.scaled_dot_product_attention`` (causal: flash attention on a GPU), SwiGLU, an untied
head; ``--dtype bf16`` runs forward and backward under bf16 autocast over fp32 weights
(as parc's bf16 trainer), ``--compile`` wraps the model in ``torch.compile``, ``--device
cuda`` puts it on the GPU. The JSON line then also has ``peak_mem_bytes`` (CUDA: peak
allocated; CPU: the process's peak resident set).

    torchrun --nproc-per-node 2 bench/torch_baseline.py --dp 2 --layers 6 ...
    python bench/torch_baseline.py --arch llama --device cuda --dtype bf16 --compile --layers 16 ...
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


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate(x, cos, sin):
    """Rotary embedding on (B, H, T, D): the two halves of each head turned by the angles."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.attn_norm = RMSNorm(hidden)
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.mlp_norm = RMSNorm(hidden)
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, -1))
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, *, layers, hidden, heads, kv_heads, ffn, vocab, seq_len, theta: float = 500000.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(LlamaBlock(hidden, heads, kv_heads, ffn) for _ in range(layers))
        self.final_norm = RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        half = hidden // heads // 2
        angles = torch.outer(torch.arange(seq_len).float(), theta ** (-torch.arange(half).float() / half))
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.head(self.final_norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def peak_mem_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


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
    parser.add_argument("--arch", choices=("gpt", "llama"), default="gpt")
    parser.add_argument("--kv-heads", type=int, default=None, help="llama: grouped-query K/V heads (default: heads)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()
    if args.arch == "llama":
        return single_device_llama(args)
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


def single_device_llama(args) -> None:
    """``--arch llama``: one device, bf16 autocast or fp32, SDPA, optionally compiled."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = Llama(layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads or args.heads,
                  ffn=args.ffn, vocab=args.vocab, seq_len=args.seq_len).to(device)
    step_model = torch.compile(model) if args.compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    times = []
    for step in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.grad_accum):
            tokens = torch.randint(0, args.vocab, (args.micro_batch, args.seq_len + 1), generator=gen, device=device)
            with autocast:
                loss = step_model(tokens[:, :-1], tokens[:, 1:]) / args.grad_accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # as a trainer logging its loss: the step's work is done
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(json.dumps({"tokens_per_s": args.micro_batch * args.grad_accum * args.seq_len / median,
                      "step_time_s": median, "peak_mem_bytes": peak_mem_bytes(device),
                      "compiled": bool(args.compile), "dtype": args.dtype, "device": args.device}))


if __name__ == "__main__":
    main()
