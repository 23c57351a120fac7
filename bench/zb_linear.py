"""ZB-V's split backward on one pipeline chunk (issue 36, part 2): plain vs B + W.

One middle chunk of bench/peer.py's pp2-zbv model (llama, 4 layers × 128 over 4
virtual stages: one layer a chunk, 4 heads, ffn 512, micro-batch 2 × seq 64, fp32, CPU,
the kernels train.py picks), forward then:

- plain: one ``torch.autograd.backward`` of the chunk's output;
- join: B then W of split_backward.py as autograd's join/restart (the linears as
  ``nn.Linear``);
- deferred: B then W with the chunk's linears swapped for split_backward.py's deferred
  linears (``defer_linear_weights``): B computes their input gradients only and W their
  weight GEMMs directly (Note [deferred linear weights]); the norms' weights kept on the
  join path;
- bare: the same chunk as train.py's zero-bubble executor has it, B a bare
  ``autograd.grad`` of the input and the norms' weights, W the GEMMs and those norm
  gradients in one engine call (Note [bare B]);
- input-only (a reference, no W): ``torch.autograd.grad`` of the chunk's input alone,
  keeping the graph: what B would cost without torch's join analysis and its hooks.

Side by side, alternating runs, medians of CPU time per pass (ms), the load printed
(the machine is shared). ``--profile`` prints, per pass, how many of torch's GEMM ops
(aten::mm/addmm/bmm) and autograd nodes of each kind run: whether a linear's matmul
node runs in both B and W.

``--last``: the last chunk instead (rank 0's chunk 1: layer 3, the final norm, the head
and the loss; B starts from the loss), whose bare B also takes the head's weight gradient
(Note [bare B]); the variants plain, join, deferred (the last chunk's B before it took
the bare path) and bare.

    python bench/zb_linear.py [--repeat 9] [--iters 20] [--threads 1] [--profile] [--last]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

import torch

from parc.runtime.models import model
from parc.runtime.parallel.pipeline import split_backward as sb

SHAPES = dict(arch="llama", layers=4, hidden=128, heads=4, kv_heads=4, ffn=512, vocab=512, padded_vocab=512,
              seq_len=64, dropout=0.0, norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=False)
MICRO_BATCH = 2
TARGETS = torch.randint(0, SHAPES["vocab"], (MICRO_BATCH, SHAPES["seq_len"]), generator=torch.Generator().manual_seed(0))


def chunk(last=False):
    """Chunk 0 of pipeline rank 1 under ZB-V's placement: virtual stage 1, one layer; ``last``:
    chunk 1 of rank 0, virtual stage 3 (the last)."""
    config = model.ModelConfig(**SHAPES)
    net = model.build_stages(config, stages=((0, 1), (1, 2), (2, 3), (3, 4)), pp_rank=0 if last else 1, pp_size=2,
                             placement="v")
    net = model.init_weights(net, seed=1, device="cpu", init_on_device=True)
    net = model.use_kernels(net, "compiled", "cpu")
    return net[1 if last else 0]


def passes(net, x, grad, variant):
    """The chunk's backward under ``variant``, as (name, thunk) in the order they run;
    ``grad`` None: the last chunk, whose output is the loss of ``TARGETS``."""
    x = x.detach().requires_grad_(True)
    y = net(x) if grad is not None else net(x, TARGETS)
    if variant == "plain":
        return [("backward", lambda: torch.autograd.backward(y, grad))]
    if variant == "input-only":
        return [("B", lambda: torch.autograd.grad(y, x, grad, retain_graph=True))]
    owed = []
    return [("B", lambda: owed.append(sb.backward_input(y, grad, x, net.parameters())[1])),
            ("W", lambda: sb.backward_weight(owed.pop()))]


def timed(net, x, grad, variant, iters) -> dict:
    """Median CPU ms of each pass over ``iters`` forward + backward rounds."""
    times = collections.defaultdict(list)
    for _ in range(iters):
        for name, run in passes(net, x, grad, variant):
            start = time.thread_time()
            run()
            times[name].append(1e3 * (time.thread_time() - start))
        net.zero_grad(set_to_none=True)
    return {name: statistics.median(ms) for name, ms in times.items()}


def profile(net, x, grad, variant) -> None:
    """How many GEMMs and autograd nodes of each kind every pass runs."""
    for name, run in passes(net, x, grad, variant):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run()
        counts = collections.Counter()
        for event in prof.events():
            if event.name in ("aten::mm", "aten::addmm", "aten::bmm"):
                counts[event.name] += 1
            elif event.name.startswith("autograd::engine::evaluate_function: "):
                counts[event.name.split(": ", 1)[1]] += 1
        gemms = {k: v for k, v in counts.items() if k.startswith("aten::")}
        nodes = {k: v for k, v in sorted(counts.items()) if not k.startswith("aten::")}
        print(f"  {variant:>8} {name:>8}: GEMMs {gemms}")
        print(f"  {'':>8} {'':>8}  nodes {nodes}")
    net.zero_grad(set_to_none=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--last", action="store_true", help="the last chunk (head and loss)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    plain = chunk(args.last)
    variants = {"plain": plain, "join": plain}
    if hasattr(sb, "defer_linear_weights"):
        variants["deferred"] = sb.defer_linear_weights([chunk(args.last)])[0]  # the same values: same seed
        for name, p in variants["deferred"].named_parameters():
            if "norm" in name or name == "head.weight":
                sb._MARKS[p] = "joined"  # Note [bare B] off: the norms (and head) on the join path
        if hasattr(sb, "_bare"):
            variants["bare"] = sb.defer_linear_weights([chunk(args.last)])[0]
    if not args.last:
        variants["input-only"] = plain
    x = torch.randn(MICRO_BATCH, SHAPES["seq_len"], SHAPES["hidden"])
    grad = None if args.last else torch.randn_like(x)
    print(f"load (1-min average): {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; torch threads {args.threads}")
    if args.profile:
        for variant, net in variants.items():
            profile(net, x, grad, variant)
    for variant, net in variants.items():  # warm-up
        timed(net, x, grad, variant, 3)
    runs = collections.defaultdict(list)
    for _ in range(args.repeat):  # alternating
        for variant, net in variants.items():
            for name, ms in timed(net, x, grad, variant, args.iters).items():
                runs[(variant, name)].append(ms)
    med = {key: statistics.median(ms) for key, ms in runs.items()}
    base = med[("plain", "backward")]
    print(f"\none chunk, CPU ms per pass, median of {args.repeat} alternating runs × {args.iters}")
    print(f"{'variant':<11}{'B':>8}{'W':>8}{'B+W':>8}{'/ plain':>9}")
    print(f"{'plain':<11}{'':>8}{'':>8}{base:>8.2f}{1.0:>8.2f}x")
    for variant in variants:
        if variant != "plain":
            b, w = med[(variant, "B")], med.get((variant, "W"), 0.0)
            print(f"{variant:<11}{b:>8.2f}{w:>8.2f}{b + w:>8.2f}{(b + w) / base:>8.2f}x")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
