"""``parc profile``: measure this machine for the planner and write a profile file.

Takes: argv (--ranks N, -o FILE, --quick). Gives: FILE, the JSON of
``codegen/planner/profile.py`` (what is measured, and how). A spec's ``mesh { profile =
"FILE" }`` points the planner at it (``planner/cost/hardware.py``).
Exit status: 0 written, 1 FILE cannot be written (checked before measuring; an existing
file is replaced only when it is a parc profile; written beside itself and renamed), 2
usage error. Before: nothing. After: ``parc plan``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..planner.profile import profile


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="measure this machine (matmul, memory, collectives) for the planner",
        description="Measure matmul FLOP/s by size, memory bandwidth, op overhead and, over N "
        "ranks of the real backend, collective latency and bandwidth; write a profile JSON "
        "that a spec names with mesh { profile = \"FILE\" }.",
    )
    parser.add_argument("--ranks", type=int, default=2, metavar="N", help="ranks for the collectives (default 2)")
    parser.add_argument("-o", "--output", metavar="FILE", required=True, help="the profile to write")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a rougher profile, for tests)")
    parser.set_defaults(func=run_profile)


def unwritable(path: str) -> str | None:
    """Why ``-o FILE`` cannot take a profile, or None. A file already there is replaced only
    when it is a parc profile (re-profiling a machine), never any other file."""
    from parc.runtime.paths import UnwritablePath, check_target

    from ..planner.cost.hardware import ProfileError, read_profile

    try:
        check_target(path, folder=False)
    except UnwritablePath as exc:
        return str(exc)
    if os.path.exists(path):
        try:
            read_profile(path)
        except ProfileError:
            return f"{path} exists and is not a parc profile: remove it, or name another file"
    return None


def run_profile(args: argparse.Namespace) -> int:
    if args.ranks < 1:
        print("parc: error: --ranks must be at least 1", file=sys.stderr)
        return 2
    problem = unwritable(args.output)
    if problem:  # before minutes of measuring
        print(f"parc profile: {problem}", file=sys.stderr)
        return 1
    data = profile(args.ranks, quick=args.quick)
    tmp = os.path.join(os.path.dirname(os.path.abspath(args.output)), f".{os.path.basename(args.output)}.parc-tmp")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, args.output)
    except OSError as exc:
        print(f"parc profile: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    best = max(row["flops"] for row in data["matmul"])
    print(f"wrote {args.output}: matmul up to {best / 1e9:.1f} GFLOP/s per rank, memory "
          f"{data['memory_bandwidth'] / 1e9:.1f} GB/s, {data['op_overhead_s'] * 1e6:.1f} µs per op, "
          f"{data['cores']} cores")
    for name, row in sorted(data["collectives"].items()):
        print(f"  {name:<15} {row['ranks']} ranks: latency {row['latency_s'] * 1e6:8.1f} µs, "
              f"bandwidth {row['bandwidth'] / 1e9:6.2f} GB/s")
    return 0
