"""Initialization allocates one shard per parameter per rank (Note [counter-based init]).

A rank of the llama-7b example (tp 4, its own TP_PLAN, sequence parallel) builds one
pipeline stage of one block through the trainer's path in a separate process
(``init_memory_worker.py``: a fake process group, so no peers are needed); every CPU
tensor created while building is tracked until its storage dies, and the peak must
stay within 5% of the parameters the rank keeps: the full (unsharded) weights, 4× the
shard, are never materialized.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("init_memory_worker.py")


def test_llama_7b_shard_init_allocates_only_the_shard():
    done = subprocess.run([sys.executable, str(WORKER), "4", "1", "5"], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # one llama-7b block over tp 4: q, o (4096²/4 each), k, v (1024·4096/4 each),
    # gate, up, down (11008·4096/4 each) and the two norms (4096 each, replicated)
    expected = (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 11008 * 4096) // 4 + 2 * 4096
    assert result["elements"] == expected
    assert result["shard_bytes"] == 4 * expected
    assert result["peak_bytes"] <= 1.05 * result["shard_bytes"], result
    assert abs(result["std"] - 0.02) < 0.001
