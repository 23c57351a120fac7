"""``parc import``'s memory against the model's size (Note [import streams] in codegen/hf_import.py).

Writes a Llama of about ``--params`` parameters with transformers (random init, fp32,
``save_pretrained``), then, each in a fresh process, measures the peak anonymous
memory (``RssAnon`` of /proc/self/status, sampled every 5 ms: the heap, not the page
cache the safetensors mmap touches) of:

- baseline: the whole model in memory, as a converter that reads it all first holds it
  (``safetensors.torch.load_file``, each tensor copied out of the mmap);
- parc import: ``parc import`` of the folder (the spec and the DCP checkpoint written).

Both above the same process's memory before the call, next to the file's size. Usage:
``python bench/import_memory.py [--params 150e6] [--dir /tmp/import_bench]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

PROBE = """
import sys, threading, time
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
peak = [0]
def sample():
    while True:
        peak[0] = max(peak[0], anon()); time.sleep(0.005)
kind, folder, out = sys.argv[1:]
import torch, torch.distributed.checkpoint, safetensors.torch
from parc.codegen import hf_import
before = anon()
threading.Thread(target=sample, daemon=True).start()
start = time.perf_counter()
if kind == "baseline":
    weights = {k: v.clone() for k, v in safetensors.torch.load_file(folder + "/model.safetensors").items()}
else:
    hf_import.import_folder(folder, out)
seconds = time.perf_counter() - start
time.sleep(0.02)
print((max(peak[0], anon()) - before) / 2**20, seconds)
"""


WRITE = """
import sys, torch, transformers
folder, layers = sys.argv[1], int(sys.argv[2])
config = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                                  num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=256,
                                  tie_word_embeddings=False)
torch.manual_seed(0)
transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
"""


def write_model(folder: str, params: float) -> None:
    """A Llama of hidden 1024 with as many blocks (about 12.6 M parameters each) as ``params`` needs.

    In a process of its own started outside bench/ (whose kernels.py would shadow a
    package transformers imports)."""
    layers = max(1, round((params - 2 * 32000 * 1024) / 12.6e6))
    subprocess.run([sys.executable, "-c", WRITE, folder, str(layers)], check=True, cwd=os.path.dirname(folder))


def measure(kind: str, folder: str, out: str) -> tuple[float, float]:
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", PROBE, kind, folder, out], capture_output=True, text=True, check=True,
                          cwd=os.path.dirname(folder))
    mib, seconds = done.stdout.split()
    return float(mib), float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=float, default=150e6)
    parser.add_argument("--dir", default="/tmp/import_bench")
    args = parser.parse_args()
    folder, out = os.path.join(args.dir, "llama"), os.path.join(args.dir, "parc")
    os.makedirs(args.dir, exist_ok=True)
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        write_model(folder, args.params)
    size = os.path.getsize(os.path.join(folder, "model.safetensors")) / 2**20
    print(f"model.safetensors: {size:.0f} MiB (fp32)")
    print("| what | peak anonymous memory above start (MiB) | of the file | seconds |")
    print("|---|---|---|---|")
    for kind in ("baseline", "import"):
        mib, seconds = measure(kind, folder, out)
        label = "load_file + copy (whole model)" if kind == "baseline" else "parc import (streamed)"
        print(f"| {label} | {mib:.0f} | {mib / size:.2f} | {seconds:.1f} |")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
