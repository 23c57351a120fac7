"""Fused kernels vs eager PyTorch vs torch.compile, per op and direction, on this machine.

For each op and shape it times the eager reference (runtime/kernels/reference.py),
the same reference under ``torch.compile`` (compile time excluded: warmed up first)
and parc's compiled op (C++ on CPU, Triton on CUDA), forward alone and forward + backward, and
prints the best of ``--repeats`` runs in ms (the best, not the median: on a shared
machine the other processes only ever add time), parc's speed-up over both, and parc's
achieved bandwidth next to the machine's, measured here as a large ``copy_``.

parc GB/s = the bytes the op must move at least (each input read once, each output
written once, element size s, per-row statistics and weights left out) / parc time:

    layer_norm, rms_norm, bias_gelu   (N × C)  fwd 2·N·C·s        fwd+bwd 5·N·C·s
    add_layer_norm, add_rms_norm      (N × C)  fwd 4·N·C·s        fwd+bwd 8·N·C·s
    swiglu                            (N × C)  fwd 3·N·C·s        fwd+bwd 8·N·C·s
    rotary  q and k, each (B, H, T, D) = N·C   fwd 4·N·C·s        fwd+bwd 8·N·C·s
    cross_entropy                     (N × V)  fwd 1·N·V·s        fwd+bwd 3·N·V·s
    permute_rows  N tokens, 2N rows   (N × C)  fwd 4·N·C·s        fwd+bwd 7·N·C·s
    combine_rows  2N rows → N tokens  (N × C)  fwd 3·N·C·s        fwd+bwd 9·N·C·s
    grouped_mm    2N rows, 8 experts of (C × C): rows in and out only (compute-bound)

The MoE ops route each of N tokens to 2 of 8 experts (top-2, uneven counts; one
expert empty). On CUDA grouped_mm is torch's grouped GEMM for bf16 and one mm per
expert otherwise (Note [grouped GEMM on CUDA] in runtime/kernels/triton_moe.py).

add_layer_norm and add_rms_norm are the residual add fused into the norm (y, h =
norm(x + residual), x + residual); their eager baseline is the add and then the norm,
and backward gets a gradient for both y and h.

The rotary shape for rows × cols is (B, H, T, D) = (rows/1024, cols/64, 1024, 64),
the same element count. machine GB/s = 2 · bytes of a 512 MiB tensor / best copy
time (read + write); "of copy" is parc GB/s as a share of it (the goal at shapes
larger than the caches: ≥ 60%). The load average is printed before and after (a busy
machine slows every column, not the ratios alone). A benchmark, not a test: figures
compare only within one run.

    python bench/kernels.py [--shapes 4096x1024 8192x4096] [--ce-shapes 1024x32000 4096x32000] [--moe-shapes 4096x1024]
                            [--ops layer_norm ...] [--repeats 5] [--no-compile] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parc.runtime.kernels import reference, select  # noqa: E402

OPS = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "bias_gelu", "swiglu", "rotary", "cross_entropy",
       "permute_rows", "combine_rows", "grouped_mm")
TRAFFIC = {  # (fwd, fwd+bwd) bytes in units of elements·s
    "layer_norm": (2, 5), "rms_norm": (2, 5), "bias_gelu": (2, 5),
    "add_layer_norm": (4, 8), "add_rms_norm": (4, 8),
    "swiglu": (3, 8), "rotary": (4, 8), "cross_entropy": (1, 3),
    "permute_rows": (4, 7), "combine_rows": (3, 9), "grouped_mm": (4, 12),
}
MOE_SHAPES = ["4096x1024", "8192x1024"]
MOE_OPS = ("permute_rows", "combine_rows", "grouped_mm")


def make_case(op, rows, cols, dtype, device):
    """(fn(ops_or_reference, *inputs), inputs) for one op and shape."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device).requires_grad_(True)

    if op == "layer_norm":
        return (lambda m, x, w, b: m.layer_norm(x, w, b, 1e-5)), (randn(rows, cols), randn(cols), randn(cols))
    if op == "rms_norm":
        return (lambda m, x, w: m.rms_norm(x, w, 1e-5)), (randn(rows, cols), randn(cols))
    if op == "add_layer_norm":
        return ((lambda m, x, r, w, b: m.add_layer_norm(x, r, w, b, 1e-5)),
                (randn(rows, cols), randn(rows, cols), randn(cols), randn(cols)))
    if op == "add_rms_norm":
        return (lambda m, x, r, w: m.add_rms_norm(x, r, w, 1e-5)), (randn(rows, cols), randn(rows, cols), randn(cols))
    if op == "bias_gelu":
        return (lambda m, x, b: m.bias_gelu(x, b)), (randn(rows, cols), randn(cols))
    if op == "swiglu":
        return (lambda m, g, u: m.swiglu(g, u)), (randn(rows, cols), randn(rows, cols))
    if op == "rotary":
        T, D = min(1024, rows), 64
        B, H = max(1, rows // T), max(1, cols // D)
        q = randn(B, T, H * D).view(B, T, H, D).transpose(1, 2)  # as Attention makes them
        k = randn(B, T, H * D).view(B, T, H, D).transpose(1, 2)
        return (lambda m, q, k: m.rotary(q, k, 10000.0)), (q, k)
    if op == "cross_entropy":
        targets = torch.randint(0, cols - 7, (rows,), generator=gen).to(device)
        vocab = cols - 7  # a few padding columns, as a padded vocab has
        return (lambda m, l: _ce(m, l, targets, vocab)), (randn(rows, cols),)
    if op in ("permute_rows", "combine_rows", "grouped_mm"):
        chosen = torch.randint(0, 7, (2 * rows,), generator=gen)  # top-2 of 8, expert 7 empty
        order = torch.sort(chosen, stable=True).indices
        index, counts = (order // 2).to(device), torch.bincount(chosen, minlength=8)
        if op == "permute_rows":
            return (lambda m, x: m.permute_rows(x, index)), (randn(rows, cols),)
        if op == "combine_rows":
            return (lambda m, y, w: m.combine_rows(y, index, w, rows)), (randn(2 * rows, cols), randn(2 * rows))
        weight = (torch.randn(8, cols, cols, generator=gen) / cols**0.5).to(dtype).to(device).requires_grad_(True)
        return (lambda m, x, w: m.grouped_mm(x, w, counts)), (randn(2 * rows, cols), weight)
    raise ValueError(op)


def _ce(m, logits, targets, vocab):
    if m is reference:
        return reference.cross_entropy(logits, targets, vocab)
    return m.cross_entropy(logits, targets, vocab_size=vocab)


def timed(fn, inputs, backward, repeats):
    """Best ms of fn(*inputs) (and its backward with a fixed upstream gradient)."""
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    grads = [torch.randn_like(o) for o in outs]
    leaves = [t for t in inputs if t.requires_grad]

    def once():
        result = fn(*inputs)
        results = result if isinstance(result, tuple) else (result,)
        if backward:
            torch.autograd.grad(results, leaves, grads)

    once()  # warm-up (and torch.compile's compile)
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        once()
        sync()
        samples.append(time.perf_counter() - start)
    return 1e3 * min(samples)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def machine_gbps(device):
    src = torch.empty(2**27, dtype=torch.float32, device=device).fill_(1.0)  # 512 MiB
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / best / 1e9


def parse_shape(text):
    rows, cols = text.lower().split("x")
    return int(rows), int(cols)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["4096x1024", "8192x4096"])
    parser.add_argument("--ce-shapes", nargs="+", default=["1024x32000", "4096x32000"])
    parser.add_argument("--moe-shapes", nargs="+", default=MOE_SHAPES, help="tokens x hidden of the MoE ops")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (its compiles take minutes)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    ops = select("compiled", args.device)
    if ops is None:
        sys.exit("bench/kernels.py: the compiled kernels are unavailable (see the line above)")
    load_before = os.getloadavg()
    bandwidth = machine_gbps(args.device)
    rows_out = []
    for op in args.ops:
        shapes = args.ce_shapes if op == "cross_entropy" else args.moe_shapes if op in MOE_OPS else args.shapes
        for shape in shapes:
            rows, cols = parse_shape(shape)
            fn, inputs = make_case(op, rows, cols, dtype, args.device)
            torch._dynamo.reset()  # a fresh compile per case (they share one lambda's code object)
            compiled_ref = None if args.no_compile else torch.compile(lambda *xs: fn(reference, *xs), dynamic=False)
            element = inputs[0].element_size()
            for backward, direction in ((False, "forward"), (True, "forward+backward")):
                eager_ms = timed(lambda *xs: fn(reference, *xs), inputs, backward, args.repeats)
                compile_ms = None if compiled_ref is None else timed(compiled_ref, inputs, backward, args.repeats)
                parc_ms = timed(lambda *xs: fn(ops, *xs), inputs, backward, args.repeats)
                moved = TRAFFIC[op][backward] * rows * cols * element
                rows_out.append(dict(
                    op=op, shape=f"{rows}x{cols}", direction=direction, eager_ms=round(eager_ms, 3),
                    compile_ms=None if compile_ms is None else round(compile_ms, 3), parc_ms=round(parc_ms, 3),
                    parc_gbps=round(moved / parc_ms / 1e6, 2), machine_gbps=round(bandwidth, 2),
                    load=round(os.getloadavg()[0], 2),
                ))
                if not args.json:
                    if len(rows_out) == 1:
                        print(_header())
                    print(_row(rows_out[-1]), flush=True)
    if args.json:
        print(json.dumps(rows_out, indent=1))
    else:
        print(f"\n{torch.get_num_threads()} threads, {args.dtype}, device {args.device}; machine copy bandwidth "
              f"{bandwidth:.1f} GB/s; load average (1, 5, 15 min) {_load(load_before)} before, "
              f"{_load(os.getloadavg())} after, on {os.cpu_count()} CPUs")


def _load(triple):
    return "/".join(f"{v:.2f}" for v in triple)


def _header():
    return (f"{'op':<16}{'shape':<12}{'direction':<18}{'eager ms':>10}{'compile ms':>12}{'parc ms':>10}"
            f"{'vs eager':>10}{'vs compile':>12}{'parc GB/s':>11}{'machine':>9}{'of copy':>9}")


def _row(r):
    compile_ms = "-" if r["compile_ms"] is None else f"{r['compile_ms']:.2f}"
    vs_compile = "-" if r["compile_ms"] is None else f"{r['compile_ms'] / r['parc_ms']:.2f}x"
    return (f"{r['op']:<16}{r['shape']:<12}{r['direction']:<18}{r['eager_ms']:>10.2f}{compile_ms:>12}"
            f"{r['parc_ms']:>10.2f}{r['eager_ms'] / r['parc_ms']:>9.2f}x{vs_compile:>12}"
            f"{r['parc_gbps']:>11.1f}{r['machine_gbps']:>9.1f}{r['parc_gbps'] / r['machine_gbps']:>9.0%}")


if __name__ == "__main__":
    main()
