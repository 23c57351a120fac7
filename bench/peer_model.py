"""parc's and torchtitan's Llama alone, trainers aside: forward and backward of one
micro-batch, alternating in one process, one thread, timed in this thread's CPU time.

bench/peer.py compares whole trainers; this compares the two models' ops on the same
shapes (bench/peer.py's ``Shapes``), so what differs between the trainers' figures and
this one is the trainers' (their pipeline, hooks, optimizer, ...). Needs torchtitan
installed for the bench (``python bench/peer.py --setup``).

    python bench/peer_model.py [--iterations 60] [--profile] [--phases]

``--phases`` splits parc's self CPU into forward and backward, by op and input shapes
(the profiler's own cost inflates small ops several-fold: compare rows, not sums).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / ".peer" / "site"), str(HERE)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=60, help="alternating pairs (the first 10 are warm-up)")
    parser.add_argument("--profile", action="store_true", help="then each side's ops by self CPU, 20 iterations")
    parser.add_argument("--phases", action="store_true", help="then parc's forward and backward apart, 20 iterations")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    import peer
    import peer_titan

    peer_titan._cpu_device()  # before any torchtitan module copies the device's name
    from parc.runtime.models import model, pipeline_stages

    shapes = peer.Shapes()
    config = model.ModelConfig(
        arch="llama", layers=shapes.layers, hidden=shapes.hidden, heads=shapes.heads, kv_heads=shapes.kv_heads,
        ffn=shapes.ffn, vocab=shapes.vocab, padded_vocab=shapes.vocab, seq_len=shapes.seq_len, dropout=0.0,
        norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=False)
    net = pipeline_stages.build_stages(config, stages=((0, shapes.layers),), pp_rank=0, pp_size=1)
    net = model.init_weights(net, seed=1, device=torch.device("cpu"))
    parc = model.use_kernels(net, "compiled", torch.device("cpu"))[0]
    titan_args = argparse.Namespace(layers=shapes.layers, hidden=shapes.hidden, heads=shapes.heads,
                                    kv_heads=shapes.kv_heads, ffn=shapes.ffn, vocab=shapes.vocab,
                                    seq_len=shapes.seq_len, rope_theta=10000.0, norm_eps=1e-5)
    titan = peer_titan._llama_spec(titan_args, shapes.hidden // shapes.heads).model.build()
    for p in titan.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    tokens = torch.randint(0, shapes.vocab, (shapes.micro_batch, shapes.seq_len))
    targets = torch.randint(0, shapes.vocab, (shapes.micro_batch, shapes.seq_len))

    def run_parc():
        parc(tokens, targets).backward()

    def run_titan():  # torchtitan's loss: summed cross-entropy over the token count
        logits = titan(tokens)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
        (loss / targets.numel()).backward()

    sides = {"parc": run_parc, "torchtitan": run_titan}
    times = {name: [] for name in sides}
    for i in range(args.iterations):
        for name, run in sides.items():
            start = time.thread_time()
            run()
            if i >= 10:
                times[name].append(time.thread_time() - start)
    p, t = (statistics.median(times[name]) for name in sides)
    print(f"llama {shapes.layers}x{shapes.hidden}, micro-batch {shapes.micro_batch}x{shapes.seq_len}, 1 thread: "
          f"forward+backward {1e3 * p:.2f} ms parc, {1e3 * t:.2f} ms torchtitan (torchtitan/parc {t / p:.2f})")
    if args.profile:
        for name, run in sides.items():
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
                for _ in range(20):
                    run()
            print(f"== {name}\n" + profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    if args.phases:
        phases(parc, tokens, targets)


def phases(parc, tokens, targets, iterations=20, rows=25) -> None:
    """parc's ops by self CPU a micro-batch, forward and backward apart, with input shapes."""
    import collections

    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as profile:
        for _ in range(iterations):
            with torch.profiler.record_function("FORWARD"):
                loss = parc(tokens, targets)
            with torch.profiler.record_function("BACKWARD"):
                loss.backward()
    events = profile.events()
    spans = {name: [e.time_range for e in events if e.name == name] for name in ("FORWARD", "BACKWARD")}
    for phase, ranges in spans.items():
        totals = collections.defaultdict(lambda: [0.0, 0])
        for e in events:
            if e.name not in spans and any(r.start <= e.time_range.start and e.time_range.end <= r.end for r in ranges):
                row = totals[(e.name[:44], str(e.input_shapes)[:60])]
                row[0], row[1] = row[0] + e.self_cpu_time_total, row[1] + 1
        print(f"== parc {phase.lower()}: self CPU {sum(t for t, _ in totals.values()) / iterations / 1e3:.2f} ms"
              " a micro-batch (ms, calls a micro-batch, op, input shapes)")
        for (name, shapes), (total, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:rows]:
            print(f"{total / iterations / 1e3:7.3f} {calls // iterations:4d}  {name:44s} {shapes}")


if __name__ == "__main__":
    main()
