"""Step overheads off the critical path (issue 22, item 2): each one before and after.

Side by side in one run, alternating, medians after warm-up, on a small Llama (the
tiny example's shapes, fp32, CPU):

- saved-tensor hooks (``memory.SavedActivations``) on a training step: every step
  before; on steps 1-2, every ``--memory-every`` N-th (10) and the last after
  (Note [memory on some steps]). Rows: one step with the hooks, one without, and the
  mean step over 10 steps under each policy.
- the all-gather of every rank's memory (``memory.report``) over 2 gloo ranks: the
  same policy; rows: one report, and its mean cost per step under each policy.
- ``loss.item()`` per micro-batch (before) vs one device sum and one sync a step
  (the generated trainer's, already so before this issue).
- ZeRO-1 after backward: every gradient copied into a full-size flat buffer and this
  rank's slice cloned out of it (before) vs each parameter's overlap with the slice
  copied straight into it (``ShardedAdamW._slice_grad``, after), dp = 2, on a larger
  model (8 layers × 512) where the copy shows.
- custom-op dispatch of the fused ops on small shapes: a norm's forward and backward
  at 128×128 (and SwiGLU at 128×512) entered as the ``torch.library.custom_op``
  (before) vs ``kernels.dispatch.call``'s direct path (after; Note [custom-op
  dispatch]), with eager PyTorch as a third column.

- eager vs compiled at small shapes (Note [eager at small shapes]): per kind of fused
  op and size, eager / parc of a forward and backward (above 1: the kernel pays; the best
  of the repeats of each, as bench/kernels.py), and a
  training step of the small Llama with the kernels everywhere (before) vs the kinds
  ``model.use_kernels`` picks at its size (after), eager PyTorch as a third column.

    python bench/overheads.py [--steps 20] [--repeat 9] [--only dispatch|small] [--threads 1]

Prints the machine's load (1-minute average) with each table: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parc.runtime.train import memory  # noqa: E402
from parc.runtime.models import model  # noqa: E402
from parc.runtime.layout.model_desc import ModelConfig  # noqa: E402

CONFIG = ModelConfig(arch="llama", layers=4, hidden=128, heads=4, kv_heads=4, ffn=512, vocab=512,
                     padded_vocab=512, seq_len=64)
MICRO, ACCUM = 2, 4
EVERY = 10


def build():
    net = model.init_weights(model.build_model(CONFIG), seed=1, device="cpu")  # one rank, no transform
    return model.use_kernels(net, "compiled", "cpu")


def batches():
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(0, CONFIG.vocab, (MICRO, CONFIG.seq_len), generator=gen),
             torch.randint(0, CONFIG.vocab, (MICRO, CONFIG.seq_len), generator=gen)) for _ in range(ACCUM)]


def step(net, data, activations, *, hooks: bool, item_per_micro: bool) -> float:
    activations.active = hooks
    start = time.perf_counter()
    with activations:
        loss_sum = 0.0
        for inputs, targets in data:
            loss = net(inputs, targets) / ACCUM
            loss.backward()
            loss_sum += loss.item() if item_per_micro else loss.detach()
        float(loss_sum)
    net.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def median_ms(samples) -> float:
    return 1e3 * statistics.median(samples)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min), {five:.2f} (5 min), {os.cpu_count()} CPUs"


def bench_steps(repeat: int, steps: int) -> None:
    torch.manual_seed(0)
    net, data = build(), batches()
    activations = memory.SavedActivations(net)
    variants = {
        "step, hooks on": dict(hooks=True, item_per_micro=False),
        "step, hooks off": dict(hooks=False, item_per_micro=False),
        "step, loss.item() per micro-batch": dict(hooks=False, item_per_micro=True),
    }
    for _ in range(2):  # warm-up
        for kwargs in variants.values():
            step(net, data, activations, **kwargs)
    times = {name: [] for name in variants}
    for _ in range(repeat):
        for name, kwargs in variants.items():  # alternating
            times[name].append(step(net, data, activations, **kwargs))
    on, off = median_ms(times["step, hooks on"]), median_ms(times["step, hooks off"])
    measured = sum(memory.measured(s, every=EVERY, first=1, last=steps) for s in range(1, steps + 1))
    policy = off + (on - off) * measured / steps
    item = median_ms(times["step, loss.item() per micro-batch"])
    print(f"## saved-tensor hooks and loss syncs, {CONFIG.arch} {CONFIG.layers}x{CONFIG.hidden}, "
          f"{ACCUM} micro-batches of {MICRO}x{CONFIG.seq_len}; {load()}")
    print(f"{'overhead':<44} {'before ms':>10} {'after ms':>10} {'after/before':>13}")
    print(f"{'hooks: one step (every step / none)':<44} {on:>10.2f} {off:>10.2f} {off / on:>13.3f}")
    print(f"{f'hooks: mean step over {steps} (every / policy)':<44} {on:>10.2f} {policy:>10.2f} {policy / on:>13.3f}")
    print(f"{'loss sync: item() per micro / one per step':<44} {item:>10.2f} {off:>10.2f} {off / item:>13.3f}")


def _gather_worker(rank: int, world: int, port: int, repeat: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    net = build()
    activations = memory.SavedActivations(net)
    optimizer = torch.optim.AdamW(net.parameters())
    for _ in range(5):
        memory.report(net, optimizer, activations, 0)
    samples = []
    for _ in range(repeat):
        torch.distributed.barrier()
        start = time.perf_counter()
        memory.report(net, optimizer, activations, 0)
        samples.append(time.perf_counter() - start)
    if rank == 0:
        out.put(samples)
    torch.distributed.destroy_process_group()


def bench_gather(repeat: int, steps: int) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=_gather_worker, args=(r, 2, port, max(repeat, 50), out)) for r in range(2)]
    for p in procs:
        p.start()
    samples = out.get()
    for p in procs:
        p.join()
    one = median_ms(samples)
    measured = sum(memory.measured(s, every=EVERY, first=1, last=steps) for s in range(1, steps + 1))
    print(f"\n## memory report all-gather over 2 gloo ranks; {load()}")
    print(f"{'overhead':<44} {'before ms':>10} {'after ms':>10} {'after/before':>13}")
    print(f"{f'all-gather: mean per step over {steps}':<44} {one:>10.3f} {one * measured / steps:>10.3f} "
          f"{measured / steps:>13.3f}")


class _Shard:
    """What ``ShardedAdamW._slice_grad`` reads: the parameters and this rank's slice."""

    def __init__(self, params, rank: int, dp: int):
        total = sum(p.numel() for p in params)
        self.shard = -(-total // dp)
        self.params, self.lo, self.hi = params, rank * self.shard, (rank + 1) * self.shard
        self.flat = torch.zeros(self.shard * dp)


def flat_then_slice(shard: _Shard) -> torch.Tensor:
    """ZeRO-1 before this issue: the whole flat gradient, then our slice of it."""
    flat = torch.zeros_like(shard.flat)
    offset = 0
    for p in shard.params:
        flat[offset : offset + p.numel()].copy_(p.grad.reshape(-1))
        offset += p.numel()
    return flat[shard.lo : shard.hi].clone()


def bench_zero1(repeat: int) -> None:
    from parc.runtime.parallel.data.zero import ShardedAdamW

    big = ModelConfig(arch="llama", layers=8, hidden=512, heads=8, kv_heads=8, ffn=2048, vocab=512,
                      padded_vocab=512, seq_len=64)
    net = model.use_kernels(model.init_weights(model.build_model(big), seed=1, device="cpu"), "compiled", "cpu")
    params = list(dict.fromkeys(net.parameters()))
    grads = [torch.randn_like(p) for p in params]
    shard = _Shard(params, rank=1, dp=2)

    def with_grads(function):
        for p, g in zip(params, grads):
            p.grad = g
        start = time.perf_counter()
        out = function(shard)
        return time.perf_counter() - start, out

    _, before = with_grads(flat_then_slice)
    _, after = with_grads(ShardedAdamW._slice_grad)
    if not torch.equal(before, after):
        raise SystemExit("bench/overheads.py: the two ZeRO-1 slices differ")
    times = {"before": [], "after": []}
    for _ in range(max(repeat, 15)):
        times["before"].append(with_grads(flat_then_slice)[0])
        times["after"].append(with_grads(ShardedAdamW._slice_grad)[0])
    b, a = median_ms(times["before"]), median_ms(times["after"])
    count = sum(p.numel() for p in params)
    print(f"\n## ZeRO-1 gradient slice after backward, {count / 1e6:.1f}M parameters, dp 2; {load()}")
    print(f"{'overhead':<44} {'before ms':>10} {'after ms':>10} {'after/before':>13}")
    print(f"{'flat copy + slice / slice copied directly':<44} {b:>10.2f} {a:>10.2f} {a / b:>13.3f}")


def bench_dispatch(repeat: int) -> None:
    from parc.runtime import kernels
    from parc.runtime.kernels import ops

    if kernels.select("compiled", "cpu") is None:
        print("\n## fused-op dispatch: no compiled CPU kernels here (see the notice above); skipped")
        return
    rows, C = 128, 128
    x = torch.randn(rows, C, requires_grad=True)
    w, b = torch.ones(C, requires_grad=True), torch.zeros(C, requires_grad=True)
    gate, up = (torch.randn(rows, 4 * C, requires_grad=True) for _ in range(2))
    g, g4 = torch.randn(rows, C), torch.randn(rows, 4 * C)
    cases = {  # (before: the custom op, after: ops' public function, eager)
        "layer_norm fwd+bwd 128x128": (
            lambda: ops.layer_norm_fwd(x, w, b, 1e-5)[0].backward(g),
            lambda: ops.layer_norm(x, w, b, 1e-5).backward(g),
            lambda: torch.nn.functional.layer_norm(x, (C,), w, b, 1e-5).backward(g)),
        "rms_norm fwd+bwd 128x128": (
            lambda: ops.rms_norm_fwd(x, w, 1e-5)[0].backward(g),
            lambda: ops.rms_norm(x, w, 1e-5).backward(g),
            lambda: torch.nn.functional.rms_norm(x, (C,), w, 1e-5).backward(g)),
        "swiglu fwd+bwd 128x512": (
            lambda: ops._swiglu(gate, up).backward(g4),
            lambda: ops.swiglu(gate, up).backward(g4),
            lambda: (torch.nn.functional.silu(gate) * up).backward(g4)),
    }

    def micros(fn, n=50):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n * 1e6

    for fns in cases.values():  # warm-up
        for fn in fns:
            micros(fn, 10)
    times = {name: ([], [], []) for name in cases}
    for _ in range(max(repeat, 7)):
        for name, fns in cases.items():  # alternating
            for samples, fn in zip(times[name], fns):
                samples.append(micros(fn))
    print(f"\n## fused-op dispatch on small shapes (custom op / direct, eager for reference); {load()}")
    print(f"{'overhead (µs per call)':<44} {'before':>10} {'after':>10} {'after/before':>13} {'eager':>8}")
    for name, (before, after, eager) in times.items():
        bm, am, em = (statistics.median(s) for s in (before, after, eager))
        print(f"{name:<44} {bm:>10.1f} {am:>10.1f} {am / bm:>13.3f} {em:>8.1f}")


def bench_small(repeat: int) -> None:
    from parc.runtime import kernels
    from parc.runtime.kernels import dispatch, reference

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernels import make_case  # bench/kernels.py

    ops = kernels.select("compiled", "cpu")
    if ops is None:
        print("\n## eager vs compiled at small shapes: no compiled CPU kernels here; skipped")
        return
    nets = {}
    for label, below in (("everywhere", "0"), ("by size", None), ("eager", None)):
        saved = os.environ.pop("PARC_KERNELS_EAGER_BELOW", None)
        if below is not None:
            os.environ["PARC_KERNELS_EAGER_BELOW"] = below
        net = build()
        nets[label] = model.use_kernels(net, "eager" if label == "eager" else "compiled", "cpu")
        os.environ.pop("PARC_KERNELS_EAGER_BELOW", None)
        if saved is not None:
            os.environ["PARC_KERNELS_EAGER_BELOW"] = saved
    data = batches()
    activations = {label: memory.SavedActivations(net) for label, net in nets.items()}
    times = {label: [] for label in nets}
    for label, net in nets.items():  # warm-up
        step(net, data, activations[label], hooks=False, item_per_micro=False)
    for _ in range(max(repeat, 5)):
        for label, net in nets.items():
            times[label].append(step(net, data, activations[label], hooks=False, item_per_micro=False))
    b, a, e = (median_ms(times[k]) for k in ("everywhere", "by size", "eager"))
    chosen = sorted({type(m).__name__ for m in nets["by size"].modules() if getattr(m, "fused", None) is not None})
    print(f"\n## small Llama step ({CONFIG.layers}×{CONFIG.hidden}, seq {CONFIG.seq_len}, {ACCUM} micro-batches of "
          f"{MICRO}): kernels everywhere / by size (compiled in {', '.join(chosen) or 'none'}); {load()}")
    print(f"{'step ms':<44} {'before':>10} {'after':>10} {'after/before':>13} {'eager':>8}")
    print(f"{'kernels everywhere / chosen by size':<44} {b:>10.2f} {a:>10.2f} {a / b:>13.3f} {e:>8.2f}")
    sizes = (64, 128, 256, 512, 1024)
    print(f"\n## eager / parc µs of forward+backward, per size (rows = cols), {torch.get_num_threads()} "
          f"thread(s); {load()}")
    print(f"{'op':<16}" + "".join(f"{f'{n}x{n}':>10}" for n in sizes) + f"{'eager below':>14}")
    for name in dispatch.EAGER_BELOW:  # one row per kind of fused op
        cells = []
        for n in sizes:
            fn, inputs = make_case(name, n, n, torch.float32, "cpu")
            out = fn(reference, *inputs)
            grads = [torch.randn_like(o) for o in (out if isinstance(out, tuple) else (out,))]
            leaves = [t for t in inputs if t.requires_grad]

            def run(m):
                outs = fn(m, *inputs)
                torch.autograd.grad(outs if isinstance(outs, tuple) else (outs,), leaves, grads)

            samples = {m: [] for m in (ops, reference)}
            for _ in range(max(repeat, 5)):  # alternating
                for m, times in samples.items():
                    start = time.perf_counter()
                    for _ in range(10):
                        run(m)
                    times.append(time.perf_counter() - start)
            # the best of the repeats, as bench/kernels.py: other processes only ever add time
            cells.append(min(samples[reference]) / min(samples[ops]))
        print(f"{name:<16}" + "".join(f"{c:>10.2f}" for c in cells) + f"{dispatch.EAGER_BELOW[name]:>14,}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps a run has, for the policy's mean")
    parser.add_argument("--repeat", type=int, default=9, help="alternating samples of each variant")
    parser.add_argument("--only", choices=("steps", "gather", "zero1", "dispatch", "small"), help="one table")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: a rank of a multi-rank run, which torchrun gives 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tables = {"steps": lambda: bench_steps(args.repeat, args.steps), "gather": lambda: bench_gather(args.repeat, args.steps),
              "zero1": lambda: bench_zero1(args.repeat), "dispatch": lambda: bench_dispatch(args.repeat),
              "small": lambda: bench_small(args.repeat)}
    for name, table in tables.items():
        if args.only in (None, name):
            table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
