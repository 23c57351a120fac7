"""How fast the front end reads large specs: `parc check` and `parc fmt --check`.

Generates, in a temporary folder, examples/tiny.par followed by 10k, 100k and 1M
comment lines, and with 1k, 10k, 100k and 800k duplicates (a duplicated `steps = 20` line in
the train block, 10 MB at 800k: the first ten are PAR0105 each with its quoted line, the
rest one error; Note [duplicates counted], Note [lexed lines]). Each spec
is run through the commands' own functions in this process (``run_check``,
``run_fmt``; their output goes to a buffer), so Python start-up is not counted.
Times are wall seconds, best of 3 (1 at the largest sizes).

Baseline, in the same run: reading the file and splitting it into lines, the least
any front end does. The ratio column is the time over the time for the 10x smaller
input: about 10 means linear (it was ~100, quadratic, before the line index).
Goal: every row under 5 s.

    python bench/frontend_speed.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parc.dsl.commands import run_check, run_fmt  # noqa: E402

TINY = (ROOT / "examples" / "tiny.par").read_text(encoding="utf-8")
GOAL_S = 5.0


def comments_spec(lines: int) -> str:
    """tiny.par, a blank line, then ``lines`` comment lines (canonical as it is)."""
    return TINY + "\n" + "".join(f"# note {i}\n" for i in range(lines))


def errors_spec(errors: int) -> str:
    return TINY.replace("  steps = 20\n", "  steps = 20\n" * (errors + 1))


def best_of(repeat: int, action) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def quietly(command, **options) -> int:
    args = argparse.Namespace(overrides=[], check=True, diff=False, stdout=False, matrix=False, **options)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return command(args)


def read_and_split(path: str) -> None:
    with open(path, encoding="utf-8") as handle:
        handle.read().split("\n")


def rows(folder: Path):
    cases = [("comments", n, comments_spec(n)) for n in (10_000, 100_000, 1_000_000)]
    cases += [("errors", n, errors_spec(n)) for n in (1_000, 10_000, 100_000, 800_000)]  # 800k: a 10 MB file
    previous: dict[tuple[str, str], float] = {}
    for kind, size, text in cases:
        path = folder / f"{kind}-{size}.par"
        path.write_text(text, encoding="utf-8")
        repeat = 1 if size >= 100_000 else 3
        baseline = best_of(repeat, lambda: read_and_split(str(path)))
        for command, run in (("check", run_check), ("fmt --check", run_fmt)):
            seconds = best_of(repeat, lambda: quietly(run, files=[str(path)]))
            ratio = seconds / previous[(kind, command)] if (kind, command) in previous else None
            previous[(kind, command)] = seconds
            yield kind, size, len(text) / 1e6, command, seconds, baseline, ratio


def main() -> int:
    print(f"{'input':<9} {'size':>9} {'MB':>6}  {'command':<12} {'seconds':>8} "
          f"{'read+split':>10} {'x prev':>7}")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="parc-frontend-speed-") as folder:
        for kind, size, mb, command, seconds, baseline, ratio in rows(Path(folder)):
            shown = f"{ratio:7.1f}" if ratio is not None else "      -"
            print(f"{kind:<9} {size:>9,} {mb:6.1f}  {command:<12} {seconds:8.3f} "
                  f"{baseline:10.3f} {shown}", flush=True)
            worst = max(worst, seconds)
    verdict = "ok" if worst < GOAL_S else "OVER"
    print(f"slowest {worst:.2f} s; goal < {GOAL_S:.0f} s: {verdict} "
          "(in process: run_check/run_fmt, output to a buffer)")
    return 0 if worst < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
