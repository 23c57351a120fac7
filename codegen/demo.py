"""``make demo``: parc's main job on the shipped examples, from a fresh clone.

1. ``parc check`` and ``parc fmt --check`` every spec in ``examples/``; a summary.
2. ``parc build examples/tiny.par -o build/tiny``.
3. Train the build for its 20 steps on 4 CPU ranks with ``torchrun`` (gloo), so the
   falling loss is printed by the generated program itself.

Exit status is non-zero if any step fails. Run as ``python -m parc.codegen.demo``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path.cwd()
EXAMPLES = ROOT / "examples"
TINY = EXAMPLES / "tiny.par"
BUILD = ROOT / "build" / "tiny"


def parc(*argv: str) -> int:
    print(f"$ parc {' '.join(argv)}", flush=True)
    return subprocess.call([sys.executable, "-m", "parc.codegen.cli", *argv])


def main() -> int:
    specs = sorted(EXAMPLES.glob("*.par"))
    if not specs:
        print("demo: no examples/*.par found (run from the repository root)", file=sys.stderr)
        return 2
    rows = []
    for spec in specs:
        rel = str(spec.relative_to(ROOT))
        checked = parc("check", rel) == 0
        formatted = parc("fmt", "--check", rel) == 0
        rows.append((rel, checked, formatted))
    print("\nexamples:")
    width = max(len(r[0]) for r in rows)
    for rel, checked, formatted in rows:
        print(
            f"  {rel:<{width}}  check: {'ok' if checked else 'FAILED'}"
            f"   format: {'ok' if formatted else 'would change'}"
        )
    if not all(c and f for _, c, f in rows):
        return 1

    print()
    if parc("build", str(TINY.relative_to(ROOT)), "-o", str(BUILD.relative_to(ROOT)), "--force") != 0:
        return 1

    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc-per-node", "4", str(BUILD / "train.py")]
    print(f"\n$ {' '.join(str(Path(c).relative_to(ROOT)) if c.startswith(str(ROOT)) else c for c in command)}", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main())
