"""What ``parc profile`` measures: this machine's figures for the planner's cost model.

Takes: a rank count and a time budget. Gives: ``profile(ranks, quick=)``, the profile
document (docs/planner.md, "The profile"): fp32 matmul FLOP/s over sizes on one thread
(what each torchrun rank gets: torchrun runs one thread per rank), memory bandwidth (a
large copy), the cost of one autograd op (dispatch, no arithmetic), the step time of a
few small reference models (Note [reference steps]), the cores and memory of the
machine, and for N ranks on the real backend (gloo, processes spawned here) the latency
and bandwidth of all-reduce, all-gather, reduce-scatter (through ``runtime/distributed/comm.py``'s
primitives, the ones the trainer calls) and send/recv, fitted as time = latency +
bytes / bandwidth. Note [profiling under load] in ``profile``. ``cost/hardware.py``
reads the document; the command is ``codegen/cli/profile.py``.
"""


from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time

MATMUL_SIZES = (32, 64, 128, 192, 256, 384, 512, 768, 1024)
COLLECTIVE_BYTES = tuple(4**k * 1024 for k in range(0, 7))  # 1 KiB .. 4 MiB
VERSION = 1


def _timed(fn, *, budget: float) -> float:
    """Seconds per call of ``fn``: the median of five batches lasting ``budget`` in all, each
    batch's mean (after a warm-up call) — a sustained rate, robust to a passing burst of
    load on a shared machine."""
    fn()
    means = []
    for _ in range(5):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= budget / 5 or calls >= 20_000:
                break
        means.append(elapsed / calls)
    return statistics.median(means)


def measure_local(budget: float) -> dict:
    import torch

    torch.set_num_threads(1)
    matmul = []
    for n in MATMUL_SIZES:
        a, b = torch.randn(n, n), torch.randn(n, n)
        seconds = _timed(lambda: torch.mm(a, b), budget=budget)
        matmul.append({"n": n, "flops": 2.0 * n**3 / seconds})
    source, target = torch.empty(16 * 2**20 // 4), torch.empty(16 * 2**20 // 4)
    copy = _timed(lambda: target.copy_(source), budget=budget)
    bandwidth = 2 * source.numel() * 4 / copy  # read and write
    leaf = torch.ones(1, requires_grad=True)

    def chain():
        x = leaf
        for _ in range(50):
            x = x * 1.0001
        x.backward()

    op_overhead = _timed(chain, budget=budget) / 100  # 50 forward ops and 50 backward ones
    elementwise = measure_elementwise(budget)
    reference = measure_reference_steps(budget)
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "matmul": matmul,
        "memory_bandwidth": bandwidth,
        "op_overhead_s": op_overhead,
        "elementwise": elementwise,
        "reference_steps": reference,
        "cores": cores,
        "memory_bytes": pages * page or None,
        "threads_per_rank": 1,
        "torch": torch.__version__,
    }


REFERENCE_MODELS = (
    {"arch": "gpt", "layers": 2, "hidden": 64, "heads": 2, "kv_heads": 2, "ffn": 256, "vocab": 256,
     "seq_len": 64, "micro_batch": 2, "micro_batches": 2},
    {"arch": "llama", "layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn": 384, "vocab": 512,
     "seq_len": 64, "micro_batch": 2, "micro_batches": 2},
    {"arch": "gpt", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn": 1024, "vocab": 1024,
     "seq_len": 128, "micro_batch": 2, "micro_batches": 2},
)
"""Note [reference steps]: three small models, one dominated by op dispatch, one by GEMMs."""


def measure_reference_steps(budget: float) -> list[dict]:
    """Note [reference steps]: seconds per training step of a few small models, run by
    parc's own runtime on one rank exactly as a one-rank trainer runs a step (forward and
    backward of each micro-batch under the saved-activation meter, ``loss.item()``,
    gradient clipping, AdamW, zero_grad).
    The planner fits its GEMM efficiency and its per-op cost to them
    (``codegen/planner/cost/fit.py``): square matmuls and a chain of scalar ops miss what a
    step pays for rectangular and transposed GEMMs and for ops on real tensors."""
    import torch

    from parc.runtime.train import memory
    from parc.runtime.optimizers import optim
    from parc.runtime.models import model as runtime_model
    from parc.runtime.kernels import select

    cpu = torch.device("cpu")
    kernels = "compiled" if select("compiled", cpu) is not None else "eager"
    rows = []
    for ref in REFERENCE_MODELS:
        config = runtime_model.ModelConfig(
            arch=ref["arch"], layers=ref["layers"], hidden=ref["hidden"], heads=ref["heads"],
            kv_heads=ref["kv_heads"], ffn=ref["ffn"], vocab=ref["vocab"], padded_vocab=ref["vocab"],
            seq_len=ref["seq_len"], tie_embeddings=ref["arch"] == "gpt",
        )
        net = runtime_model.init_weights(runtime_model.build_model(config), seed=1, device=cpu)  # one rank
        net = runtime_model.use_kernels(net, kernels, cpu)
        optimizer = optim.build_optimizer(net, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
        tokens = torch.randint(0, ref["vocab"], (ref["micro_batch"], ref["seq_len"] + 1),
                               generator=torch.Generator().manual_seed(0))
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

        activations = memory.SavedActivations(net)  # the trainer measures them every step

        def step():
            with activations:
                for _ in range(ref["micro_batches"]):
                    loss = net(inputs, targets) / ref["micro_batches"]
                    loss.backward()
                    loss.item()
            optim.clip_grad_norm_(net, 1.0, tp_group=None)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        rows.append({**ref, "kernels": kernels, "step_s": _timed(step, budget=budget)})
    return rows


def measure_elementwise(budget: float) -> dict:
    """Seconds per element of a norm and of an MLP activation, forward and backward, as the
    trainer runs them: eager PyTorch, and parc's compiled kernels (runtime/kernels) when
    they build here. Note [elementwise is not a copy]: on a CPU, GeLU's tanh and a norm's
    reductions cost far more per element than moving its bytes."""
    import torch
    import torch.nn.functional as F

    from parc.runtime.kernels import select

    rows, width = 256, 1024
    x = torch.randn(rows, width, requires_grad=True)
    gate = torch.randn(rows, width, requires_grad=True)
    weight = torch.ones(width, requires_grad=True)
    bias = torch.zeros(width, requires_grad=True)
    modes = {"eager": None}
    compiled = select("compiled", torch.device("cpu"))
    if compiled is not None:
        modes["compiled"] = compiled
    out = {}
    for mode, kernels in modes.items():
        if kernels is None:
            ops = {
                "layer_norm": lambda: F.layer_norm(x, (width,), weight, bias).sum().backward(),
                "rms_norm": lambda: F.rms_norm(x, (width,), weight).sum().backward(),
                "gelu": lambda: F.gelu(x + bias, approximate="tanh").sum().backward(),
                "swiglu": lambda: (F.silu(gate) * x).sum().backward(),
            }
        else:
            ops = {
                "layer_norm": lambda: kernels.layer_norm(x, weight, bias, 1e-5).sum().backward(),
                "rms_norm": lambda: kernels.rms_norm(x, weight, 1e-5).sum().backward(),
                "gelu": lambda: kernels.bias_gelu(x, bias).sum().backward(),
                "swiglu": lambda: kernels.swiglu(gate, x).sum().backward(),
            }
        out[mode] = {name: _timed(fn, budget=budget / 2) / x.numel() for name, fn in ops.items()}
    return out


def _fit(points) -> tuple[float, float]:
    """(latency, bandwidth) of seconds = latency + bytes / bandwidth through the smallest and
    the largest message (4096× apart: the widest baseline, the least swayed by noise)."""
    points = sorted(points)
    (b0, t0), (b1, t1) = points[0], points[-1]
    bandwidth = (b1 - b0) / (t1 - t0) if t1 > t0 else b1 / t1
    return max(0.0, t0 - b0 / bandwidth), bandwidth


def _rank_main(rank: int, world: int, port: int, budget: float, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    from parc.runtime.distributed.comm import _all_reduce
    from parc.runtime.distributed.comm_scatter import _all_gather, _reduce_scatter

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = dist.group.WORLD
    dist.barrier()
    local = measure_local(budget)  # every rank at once: the share of the machine a rank gets
    results = {"local": local}
    for name in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
        points = []
        for nbytes in COLLECTIVE_BYTES:
            elements = max(world, nbytes // 4 // world * world)
            full = torch.ones(elements)
            shard = torch.ones(elements // world)
            if name == "all_reduce":
                call = lambda: _all_reduce(full, group)  # noqa: E731
            elif name == "all_gather":
                call = lambda: _all_gather(shard, group, 0)  # noqa: E731
            elif name == "reduce_scatter":
                call = lambda: _reduce_scatter(full, group, 0)  # noqa: E731
            else:
                def call():  # ping-pong between ranks 0 and 1: two one-way messages
                    if rank == 0:
                        dist.send(full, 1)
                        dist.recv(full, 1)
                    elif rank == 1:
                        dist.recv(full, 0)
                        dist.send(full, 0)
            repeats = 3 if budget < 0.05 else 10
            dist.barrier()
            call()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            seconds = (time.perf_counter() - start) / repeats
            if name == "send_recv":
                seconds /= 2
            points.append((elements * 4, seconds))
        burst, bandwidth = _fit(points)
        small = torch.ones(world)
        shard, full = small[:1].clone(), small
        latency = _sync_latency(call, dist, repeats=10 if budget < 0.05 else 100)
        if name == "send_recv":
            latency /= 2
        results.setdefault("collectives", {})[name] = {
            "ranks": world, "latency_s": max(latency, burst), "burst_latency_s": burst,
            "bandwidth": bandwidth, "points": [[b, s] for b, s in points],
        }
    if rank == 0:
        with open(out_path, "w", encoding="utf-8") as handle:
            json.dump(results, handle)
    dist.barrier()
    dist.destroy_process_group()


def _sync_latency(call, dist, *, repeats: int) -> float:
    """Note [latency between compute]: a trainer's collective follows compute, and its
    ranks reach it at different moments (on a busy machine, a scheduler slice apart);
    the cost is measured that way: ~1 ms of matmuls then the collective, minus the
    matmuls alone, as means over many calls (a trainer pays the slow calls too, so no
    median drops them). Back-to-back calls after a barrier (``burst``) hide that wait."""
    import torch

    a = torch.randn(128, 128)

    def work():
        for _ in range(8):
            torch.mm(a, a)

    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        work()
    alone = (time.perf_counter() - start) / repeats
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        work()
        call()
    both = (time.perf_counter() - start) / repeats
    return max(0.0, both - alone)


def measure_collectives(ranks: int, budget: float) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out_path = os.path.join(folder, "collectives.json")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_rank_main, args=(ranks, port, budget, out_path), nprocs=ranks, join=True)
        with open(out_path, encoding="utf-8") as handle:
            return json.load(handle)


def profile(ranks: int, *, quick: bool = False) -> dict:
    """Note [profiling under load]: the matmul, bandwidth and op figures are measured by all
    N ranks at once, each on one thread, as torchrun's ranks run: what one rank of an
    N-rank job gets from this machine (cores shared, and whatever else runs on it)."""
    budget = 0.02 if quick else 0.2
    data = {"version": VERSION, "device": "cpu", "ranks": ranks}
    if ranks >= 2:
        measured = measure_collectives(ranks, budget)
        data.update(measured["local"])
        data["collectives"] = measured["collectives"]
    else:
        data.update(measure_local(budget))
        data["collectives"] = {}
    return data
