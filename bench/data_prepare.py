"""``parc data prepare`` on a large text file: throughput and peak memory, beside ``wc -c``.

Writes a file of ``--mb`` MiB (default 1024: the issue's 1 GB) of generated prose: plain text
(``corpus.txt``, which ``parc data prepare`` reads as one document: the streaming's hard case,
a gigabyte with no boundary to flush at) or, with ``--jsonl``, JSON Lines (a paragraph a
line, ``{"text": ...}``: many documents, the ``.idx`` filled). Then runs, each as its own
process, one after the other:

- ``wc -c FILE``: the issue's yardstick (GNU wc answers it from the file's size, without reading);
- ``wc -l FILE``: reading the same bytes once, the floor for any reader;
- ``parc data prepare FILE -o OUT.bin``: byte-level tokens, separators, ``OUT.idx``.

It prints each one's wall time, MB/s and peak resident memory (``ru_maxrss`` of that
child, from ``os.wait4``), and the ratio of parc's to ``wc -l``'s. Bounded memory means parc's
peak stays near a Python process's own size whatever ``--mb`` is: run it at two sizes to
see (``--mb 256`` and ``--mb 1024``). The machine's load is printed, since these are
shared machines. Usage: ``python bench/data_prepare.py [--mb 1024] [--jsonl] [--dir /tmp/prepare_bench]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

WORDS = ("the bread rises slowly while the oven warms and flour settles on every surface of the "
         "kitchen table where a loaf waits for its crust to set in the morning light").split()


def write_text(path: Path, mib: int, jsonl: bool, seed: int = 0) -> int:
    """About ``mib`` MiB of paragraphs, written in chunks of 4,096; its size in bytes."""
    rng = random.Random(seed)
    target, written = mib * 2**20, 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            chunk = []
            for _ in range(4096):
                paragraph = " ".join(rng.choices(WORDS, k=rng.randint(40, 400))).capitalize() + "."
                chunk.append(json.dumps({"text": paragraph}) + "\n" if jsonl else paragraph + "\n\n")
            text = "".join(chunk)
            out.write(text)
            written += len(text)
    return path.stat().st_size


def measure(command: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of ``command`` run as a child of this process."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        sys.exit(f"{command[0]} failed ({process.returncode}): {process.stderr.read().decode()[-2000:]}")
    return seconds, usage.ru_maxrss * 1024  # Linux reports KiB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="size of the generated text in MiB (default 1024)")
    parser.add_argument("--jsonl", action="store_true", help="JSON Lines, a document a paragraph (default: plain text)")
    parser.add_argument("--dir", default="/tmp/prepare_bench", help="scratch folder (emptied first)")
    args = parser.parse_args()
    folder = Path(args.dir)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    text = folder / ("corpus.jsonl" if args.jsonl else "corpus.txt")
    size = write_text(text, args.mb, args.jsonl)
    parc = [str(Path(sys.executable).with_name("parc")), "data", "prepare", str(text), "-o", str(folder / "out.bin")]
    rows = [("wc -c", *measure(["wc", "-c", str(text)])), ("wc -l", *measure(["wc", "-l", str(text)])),
            ("parc data prepare", *measure(parc))]
    load = os.getloadavg()
    print(f"{text.name}: {size / 2**20:,.0f} MiB; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'':<18} {'seconds':>9} {'MB/s':>9} {'peak RSS MiB':>13}")
    for name, seconds, peak in rows:
        print(f"{name:<18} {seconds:>9.2f} {size / 1e6 / seconds:>9.1f} {peak / 2**20:>13.1f}")
    (_, wc_s, wc_rss), (_, parc_s, parc_rss) = rows[1:]
    print(f"parc / wc -l: {parc_s / wc_s:.1f}× the time, {parc_rss / wc_rss:.1f}× the peak memory; "
          f"parc's peak is {parc_rss / size:.1%} of the text's size")
    tokens = (folder / "out.bin").stat().st_size // 2
    print(f"wrote {tokens:,} tokens (uint16) and {(folder / 'out.idx').stat().st_size // 8:,} document offsets")
    shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
