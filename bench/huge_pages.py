"""Tokens/s of a one-rank parc trainer with and without huge pages for torch's CPU tensors.

The generated trainer of a CPU mesh sets ``THP_MEM_ALLOC_ENABLE=1`` before it imports
torch (Note [huge pages on CPU] in codegen/render.py), unless the variable is already
set. This bench builds bench/peer.py's one-rank Llama (its shapes, and a larger one
whose activations pass the 2 MiB where the allocator asks for huge pages) and runs
the very same train.py alternately with ``THP_MEM_ALLOC_ENABLE=0`` (before) and ``=1``
(after), printing the median tokens/s of each (median of each run's steps after
warm-up, then the median over runs), their ratio, and the machine's load.

    python bench/huge_pages.py [--repeat 3] [--steps 6] [--shapes peer,large]

The machine is shared: compare the ratio, measured in one run, not the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer import WARMUP, Shapes, build_parc, load, run_parc  # noqa: E402  (bench/peer.py)

SHAPES = {
    "peer": Shapes(),
    "large": Shapes(hidden=512, heads=8, kv_heads=8, seq_len=256, micro_batch=4, global_batch=16),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each variant per shape")
    parser.add_argument("--steps", type=int, default=6, help=f"timed steps per run (after {WARMUP} warm-up)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    args = parser.parse_args()
    names = [name.strip() for name in args.shapes.split(",")]
    unknown = [name for name in names if name not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; choose from {', '.join(SHAPES)}")
    saved = os.environ.get("THP_MEM_ALLOC_ENABLE")
    start_load, rows = load(), []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                shapes = SHAPES[name]
                (Path(tmp) / name).mkdir()
                build = build_parc(shapes, 1, 1, WARMUP + args.steps, Path(tmp) / name)
                runs = {"0": [], "1": []}
                for _ in range(args.repeat):  # alternating
                    for value, samples in runs.items():
                        os.environ["THP_MEM_ALLOC_ENABLE"] = value
                        samples.append(run_parc(build, 1, 1, args.steps))
                    print(f"  ... {name}: without {runs['0'][-1]:.0f} tok/s, with {runs['1'][-1]:.0f} tok/s; "
                          f"{load()}", file=sys.stderr, flush=True)
                rows.append((name, shapes, statistics.median(runs["0"]), statistics.median(runs["1"])))
    finally:
        if saved is None:
            os.environ.pop("THP_MEM_ALLOC_ENABLE", None)
        else:
            os.environ["THP_MEM_ALLOC_ENABLE"] = saved
    print(f"## one-rank parc trainer, THP_MEM_ALLOC_ENABLE=0 (before) / =1 (after); fp32, CPU; medians of "
          f"{args.repeat} alternating runs x {args.steps} steps after {WARMUP} warm-up")
    print(f"## before: {start_load}; after: {load()}")
    print(f"{'shape':<40} {'before tok/s':>13} {'after tok/s':>12} {'after/before':>13}")
    for name, s, before, after in rows:
        label = f"{name}: {s.layers}x{s.hidden}, ffn {s.ffn}, {s.micro_batch}x{s.seq_len}"
        print(f"{label:<40} {before:>13.0f} {after:>12.0f} {after / before:>13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
