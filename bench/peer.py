"""Tokens/s of a parc trainer vs torchtitan 0.3.0 on the same Llama, side by side.

One Llama-style model (RMSNorm, rotary, grouped-query attention, SwiGLU; fp32, CPU,
gloo) in the layouts: 1 rank, dp2, tp2 and dp2×tp2; FSDP (parc's ZeRO-3, torchtitan's
FSDP2) over 2 ranks; a 2-stage pipeline under 1F1B, interleaved 1F1B (2 stages a rank)
and ZB-V (torchtitan's ZBVZeroBubble: parc's zero_bubble_v); and its mixture-of-experts
variant (``moe-ep2``: every block's MLP 8 routed experts, top-2, no shared experts,
each expert as wide as the dense MLP) with the experts split over 2 ranks. parc's side is the trainer
``parc build`` writes from a spec this bench writes; torchtitan's is its own Trainer
driven on CPU by bench/peer_titan.py. Runs alternate (parc, torchtitan, parc, ...),
each run reports the median step after warm-up, and the table gives the median of
those per side, their ratio, the median of each alternating pair's own ratio (the
figure bench/peer_notes.md quotes: a pair shares the machine's state, two sides'
medians need not) and the machine's load before and after.

torchtitan is an optional bench dependency that must not touch the project's pinned
torch: ``--setup`` installs it (``pip install --no-deps --target``) with the few light
packages its Trainer imports into bench/.peer/site (git-ignored), and the torchtitan
runs see it through PYTHONPATH only.

    python bench/peer.py --setup          # once
    python bench/peer.py [--repeat 3] [--steps 12] [--layouts 1,dp2,...,moe-ep2] [--global-batch 16]

What differs between the two models is printed with the table (``DIFFERENCES``); where
each side spends its time, and the last tables, are in bench/peer_notes.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "bench" / ".peer" / "site"
BIN = Path(sys.executable).parent
# torchtitan 0.3.0 and what its Trainer imports, without their dependency trees
# (torch, numpy, tokenizers, tensorboard come from the project's venv).
PACKAGES = ["torchtitan==0.3.0", "spmd_types==0.2.3", "tyro", "docstring-parser", "typeguard", "einops",
            "torchdata", "torch_checkpointing", "datasets>=3.6,<4.8", "pyarrow", "dill", "multiprocess",
            "xxhash", "fsspec", "huggingface_hub", "pandas", "httpx", "requests", "urllib3", "certifi"]


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    ep: int = 1
    moe: bool = False
    """Every block's MLP the MoE of ``Shapes`` (experts, top_k, expert_ffn)."""
    pp: int = 1
    schedule: str = "1f1b"
    """parc's pipeline schedule, and torchtitan's name for the same one:"""
    titan_schedule: str = "1F1B"
    zero: int = 0
    cp: int = 1
    precision: str = "fp32"
    """parc's train.precision (torchtitan's side stays fp32, its expert GEMMs bf16)."""
    """Context parallelism: parc's ring (load-balanced chunks), torchtitan's ring over SDPA."""
    titan_dp: str | None = None
    """torchtitan's dp kind when the layout fixes it (FSDP: shard), else --titan-dp's."""
    titan_cannot: str | None = None
    """Why torchtitan cannot run the layout here (the row then has parc's side only)."""

    @property
    def ranks(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


LAYOUTS = {
    "1": Layout(), "dp2": Layout(dp=2), "tp2": Layout(tp=2), "dp2xtp2": Layout(dp=2, tp=2),
    "fsdp-dp2": Layout(dp=2, zero=3, titan_dp="shard"),
    "cp2-ring": Layout(cp=2, titan_cannot=(
        "torchtitan's cp on CPU: its ring attention shards SDPA through DTensor, and the CPU kernel "
        "aten._scaled_dot_product_flash_attention_for_cpu has no sharding strategy (NotImplementedError); "
        "its other cp path, FlexAttention, needs torch.compile, which the bench's CPU lacks")),
    "pp2-1f1b": Layout(pp=2),
    "pp2-interleaved": Layout(pp=2, schedule="interleaved(chunks = 2)", titan_schedule="Interleaved1F1B"),
    "pp2-zbv": Layout(pp=2, schedule="zero_bubble_v", titan_schedule="ZBVZeroBubble"),
    "moe-ep2": Layout(dp=2, ep=2, moe=True, titan_dp="shard"),  # torchtitan's ep takes ranks from FSDP
    # parc under bf16 autocast: its expert GEMMs in bf16 as torchtitan's are (and the rest too)
    "moe-ep2-bf16": Layout(dp=2, ep=2, moe=True, titan_dp="shard", precision="bf16"),
}
WARMUP = 2


@dataclass(frozen=True)
class Shapes:
    layers: int = 4
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 4
    vocab: int = 512
    seq_len: int = 64
    micro_batch: int = 2
    global_batch: int = 16
    multiple_of: int = 256  # torchtitan's debug model's MLP rounding
    ffn_multiplier: float | None = None
    # the MoE layouts: torchtitan's smallest MoE (Qwen3 debugmodel_moe: 64 experts, top-8,
    # no shared experts) scaled to this model's size; both sides get these exactly
    experts: int = 8
    top_k: int = 2
    shared_experts: int = 0
    router_bias_update: float = 1e-3  # torchtitan's load_balance_coeff: aux-loss-free balancing

    @property
    def ffn(self) -> int:
        return titan_ffn(self.hidden, self.multiple_of, self.ffn_multiplier)


def titan_ffn(hidden: int, multiple_of: int, multiplier: float | None = None) -> int:
    """torchtitan's SwiGLU width (models/common/feed_forward.compute_ffn_hidden_dim):
    2/3 of 4·hidden, times the multiplier, rounded up to ``multiple_of``. Both sides
    get this width exactly: parc's spec states it, torchtitan's config is given it."""
    width = int(2 * 4 * hidden / 3)
    if multiplier is not None:
        width = int(multiplier * width)
    return multiple_of * -(-width // multiple_of)


def moe_keys(shapes: Shapes, layout: Layout) -> str:
    """The spec's MoE keys: experts as wide as the dense MLP, no aux loss (torchtitan
    balances by its router bias alone), the bias update at torchtitan's rate."""
    if not layout.moe:
        return ""
    return f"""
  experts = {shapes.experts}
  top_k = {shapes.top_k}
  expert_ffn = {shapes.ffn}
  shared_experts = {shapes.shared_experts}
  aux_loss = 0
  router_bias_update = {shapes.router_bias_update}"""


def spec_text(shapes: Shapes, layout: Layout, steps: int) -> str:
    """The parc spec of one layout: the shapes, synthetic data, no clipping differences."""
    dp, tp = layout.dp, layout.tp
    return f"""# bench/peer.py: the Llama both sides train (written by the bench).
model peer_llama {{
  arch = llama
  layers = {shapes.layers}
  hidden = {shapes.hidden}
  heads = {shapes.heads}
  kv_heads = {shapes.kv_heads}
  ffn = {shapes.ffn}
  vocab = {shapes.vocab}
  seq_len = {shapes.seq_len}
  tie_embeddings = false{moe_keys(shapes, layout)}
}}

mesh {{
  nodes = 1
  devices_per_node = {layout.ranks}
  device = cpu
}}

parallel {{
  dp = {dp}
  tp = {tp}
  pp = {layout.pp}
  schedule = {layout.schedule}
  zero = {layout.zero}
  cp = {layout.cp}
  ep = {layout.ep}
  sp = false
}}

train {{
  global_batch = {shapes.global_batch}
  micro_batch = {shapes.micro_batch}
  steps = {steps}
  optimizer = adamw(lr = 3e-4)
  schedule = cosine(warmup = 2)
  grad_clip = 1.0
  precision = {layout.precision}
  seed = 1
  data = synthetic
}}
"""


DIFFERENCES = """\
What differs (same shapes, parameter counts printed above):
- dp: parc all-reduces gradients (bucketed, overlapped with backward); torchtitan
  replicates (data_parallel_replicate_degree, DDP) unless --titan-dp shard: its FSDP2
  default reduce-scatters with PREMUL_SUM, which gloo does not have.
- init: torchtitan truncated-normal 0.02, depth-scaled for wo/w2/w3, embedding N(0,1),
  head std hidden^-0.5; parc its own (runtime/models/param_init.py). Timing only, no parity.
- moe-ep2: torchtitan's MoE block is its Qwen3-MoE one (q/k norms off, so the attention
  is the Llama one); softmax router, top-k weights renormalized on both; load balanced
  by a router bias updated after each step on both (no aux loss); torchtitan runs the
  expert GEMMs in bf16 (torch._grouped_mm on bf16 copies of x and the weights), parc
  in fp32 under precision = fp32; torchtitan's dp is FSDP2 (its ep borrows ranks from
  the FSDP degree) with sum reductions (gloo has no PREMUL_SUM), parc's is all-reduce.
- rotary: torchtitan rotates interleaved pairs (complex), parc halves; same cost.
- loss: torchtitan sums and divides by the global token count; parc means per
  micro-batch; the same arithmetic per token.
- attention: both SDPA is_causal (torchtitan's LM default is FlexAttention with
  document masks, which needs torch.compile off GPU); q/k/v unfused in both.
- fsdp-dp2: parc's ZeRO-3 against torchtitan's FSDP2 (its reduce-scatter made a SUM:
  gloo has no PREMUL_SUM); torchtitan reduces gradients every micro-batch it
  accumulates, parc once a step.
- pp2: both split the 4 layers evenly (torchtitan's first/last stage "less layers" set
  to 0); 8 micro-batches of 2 a step on both; torchtitan's schedules get the micro-
  batches through bench/peer_titan.py's shim (its 0.3.0 calls a step API the pinned
  torch lacks). parc's zero_bubble (ZB-H1, one stage a rank) has no torchtitan
  counterpart: its zero-bubble schedules are the looped ones (ZB-V, interleaved ZB).
- OpenMP: parc's CPU trainer sets GOMP_SPINCOUNT=10000 unless it is set (Note [OpenMP
  waits on shared cores]); torchtitan keeps libgomp's 300,000. With --beside that decides
  the one-rank row (2 threads a rank); export GOMP_SPINCOUNT to give both sides the same.
- MLP width: torchtitan rounds 2/3·4·hidden up to multiple_of; the bench computes
  that width once and gives it to both exactly (no rounding differs)."""


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min), {five:.2f} (5 min), {os.cpu_count()} CPUs"


def setup() -> int:
    """Install torchtitan into bench/.peer/site without touching the project's venv."""
    SITE.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(SITE), *PACKAGES]
    print("bench/peer.py: " + " ".join(command))
    done = subprocess.run(command)
    if done.returncode != 0:
        print(f"bench/peer.py: could not install torchtitan into {SITE} (pip exit {done.returncode}); "
              "the package index must offer torchtitan 0.3.0 and the packages above", file=sys.stderr)
        return 1
    check = subprocess.run([sys.executable, "-c", "import torch, torchtitan.trainer; print(torch.__version__)"],
                           env=titan_env(1), capture_output=True, text=True)
    if check.returncode != 0:
        print(f"bench/peer.py: torchtitan installed but its Trainer does not import:\n{check.stderr[-2000:]}",
              file=sys.stderr)
        return 1
    print(f"bench/peer.py: torchtitan ready in {SITE} (torch {check.stdout.strip()}, unchanged)")
    return 0


def titan_env(nproc: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // nproc)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH")) if p)
    return env


def torchrun(nproc: int, argv: list[str], env: dict, rss: Path) -> tuple[str, list[int]]:
    """Run ``argv`` (a script and its arguments) on ``nproc`` ranks through bench/peer_rss.py:
    (stdout, each rank's peak resident bytes)."""
    shutil.rmtree(rss, ignore_errors=True)
    command = [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={nproc}",
               str(ROOT / "bench" / "peer_rss.py"), str(rss), *argv]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}")
    return done.stdout, [int((rss / f"rss-rank{r}.txt").read_text()) for r in range(nproc)]


def build_parc(shapes: Shapes, name: str, layout: Layout, steps: int, workdir: Path) -> Path:
    spec = workdir / f"peer-{name}.par"
    spec.write_text(spec_text(shapes, layout, steps))
    out = workdir / f"parc-{name}"
    subprocess.run([str(BIN / "parc"), "build", str(spec), "-o", str(out)], check=True, capture_output=True)
    return out


def run_parc(build: Path, layout: Layout, steps: int) -> tuple[float, list[int]]:
    metrics = build / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // layout.ranks)))
    _, rss = torchrun(layout.ranks, [str(build / "train.py"), "--steps", str(WARMUP + steps),
                                     "--metrics-jsonl", str(metrics)], env, build / "rss")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return statistics.median(r["tokens_per_s"] for r in records[WARMUP:]), rss


def run_titan(shapes: Shapes, layout: Layout, steps: int, workdir: Path, dp_kind: str) -> dict:
    dp_kind = layout.titan_dp or dp_kind
    argv = [str(ROOT / "bench" / "peer_titan.py"), f"--dp={layout.dp}", f"--tp={layout.tp}", f"--steps={steps}",
            f"--dp-kind={dp_kind}", f"--warmup={WARMUP}", f"--pp={layout.pp}", f"--cp={layout.cp}",
            f"--schedule={layout.titan_schedule}", f"--ffn={shapes.ffn}", f"--dump={workdir / 'titan'}"]
    if layout.moe:
        argv += [f"--experts={shapes.experts}", f"--top-k={shapes.top_k}", f"--moe-ffn={shapes.ffn}",
                 f"--ep={layout.ep}"]
    for name in ("layers", "hidden", "heads", "kv_heads", "vocab", "seq_len", "micro_batch", "global_batch"):
        argv.append(f"--{name.replace('_', '-')}={getattr(shapes, name)}")
    out, rss = torchrun(layout.ranks, argv, titan_env(layout.ranks), workdir / "titan-rss")
    result = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return dict(result, rss=rss)


def per_rank(runs: list[list[int]]) -> str:
    """Each rank's median peak over the runs, in MiB, ``r0/r1/...``."""
    return "/".join(f"{statistics.median(run[r] for run in runs) / 2**20:.0f}" for r in range(len(runs[0])))


def measure(shapes: Shapes, layouts: list[str], args) -> tuple[list, list]:
    """Each layout's alternating runs: (rows against torchtitan, rows torchtitan cannot run)."""
    rows, cannot = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in layouts:
            layout = LAYOUTS[name]
            build = build_parc(shapes, name, layout, WARMUP + args.steps, Path(tmp))
            parc, titan, params, parc_rss, titan_rss = [], [], None, [], []
            for _ in range(args.repeat):  # alternating
                tokens, rss = run_parc(build, layout, args.steps)
                parc.append(tokens)
                parc_rss.append(rss)
                if layout.titan_cannot:
                    continue
                result = run_titan(shapes, layout, args.steps, Path(tmp), args.titan_dp)
                titan.append(result["tokens_per_s"])
                titan_rss.append(result["rss"])
                params = result["local_parameters"]
                print(f"  ... {name}: parc {parc[-1]:.0f} tok/s, torchtitan {titan[-1]:.0f} tok/s; {load()}",
                      file=sys.stderr, flush=True)
            if layout.titan_cannot:
                print(f"  ... {name}: parc {statistics.median(parc):.0f} tok/s; torchtitan cannot run it: "
                      f"{layout.titan_cannot}", file=sys.stderr, flush=True)
                cannot.append((name, statistics.median(parc), per_rank(parc_rss), layout.titan_cannot))
                continue
            pairs = statistics.median(p / t for p, t in zip(parc, titan))
            rows.append((name, statistics.median(parc), statistics.median(titan), pairs, params,
                         per_rank(parc_rss), per_rank(titan_rss)))
    return rows, cannot


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="store_true", help=f"install torchtitan into {SITE.relative_to(ROOT)}")
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each side per layout")
    # 12, not 6: at 6 a run's median step swung by up to 1.6x from one run to the next on a
    # quiet machine (bench/peer_notes.md, 2026-12-06 session 8); at 12 by 5%
    parser.add_argument("--steps", type=int, default=12, help=f"timed steps per run (after {WARMUP} warm-up)")
    parser.add_argument("--global-batch", type=int, default=Shapes.global_batch,
                        help="sequences a step (micro-batches of 2; under dp a rank accumulates its share)")
    parser.add_argument("--beside", type=int, default=0, metavar="N",
                        help="run N CPU-bound processes beside the bench for its whole length (a machine that is "
                        "not idle: both sides share the cores with them)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated: " + ", ".join(LAYOUTS))
    parser.add_argument("--titan-dp", choices=("replicate", "shard"), default="replicate",
                        help="torchtitan's dp: replicated parameters with all-reduced gradients (DDP, like parc's "
                        "dp; the default) or FSDP2 sharding, whose reduce-scatter needs PREMUL_SUM, which gloo lacks")
    args = parser.parse_args()
    if args.setup:
        return setup()
    if not (SITE / "torchtitan").is_dir():
        print(f"bench/peer.py: torchtitan is not installed for the bench; run: python bench/peer.py --setup",
              file=sys.stderr)
        return 1
    shapes = Shapes(global_batch=args.global_batch)
    layouts = [name.strip() for name in args.layouts.split(",")]
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layouts {unknown}; choose from {', '.join(LAYOUTS)}")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.beside)]
    try:
        start_load = load()
        rows, cannot = measure(shapes, layouts, args)
        end_load = load()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    print(f"## parc vs torchtitan 0.3.0: llama {shapes.layers}x{shapes.hidden}, {shapes.heads} heads "
          f"({shapes.kv_heads} kv), ffn {shapes.ffn}, vocab {shapes.vocab}, {shapes.global_batch} sequences "
          f"of {shapes.seq_len} a step (micro-batch {shapes.micro_batch}), fp32, CPU gloo; medians of "
          f"{args.repeat} alternating runs x {args.steps} steps after {WARMUP} warm-up")
    beside = f"; {args.beside} CPU-bound process(es) beside the bench throughout" if args.beside else ""
    print(f"## before: {start_load}; after: {end_load}{beside}")
    print(f"{'layout':<16} {'parc tok/s':>11} {'titan tok/s':>12} {'parc/titan':>11} {'pair median':>12} "
          f"{'titan params':>13} {'parc MiB/rank':>14} {'titan MiB/rank':>15}")
    for name, parc, titan, pairs, params, parc_mib, titan_mib in rows:
        print(f"{name:<16} {parc:>11.0f} {titan:>12.0f} {parc / titan:>10.2f}x {pairs:>11.2f}x {params:>13,} "
              f"{parc_mib:>14} {titan_mib:>15}")
    for name, parc, parc_mib, why in cannot:
        print(f"{name:<16} {parc:>11.0f} {'—':>12} {'—':>11} {'—':>12} {'—':>13} {parc_mib:>14} {'—':>15}  ({why})")
    print("pair median: the median over the alternating pairs of parc's tok/s / torchtitan's in that pair")
    print("MiB/rank: each rank's peak resident memory (bench/peer_rss.py), the median over runs, rank 0 first")
    if any(LAYOUTS[name].moe for name in layouts):
        print(f"moe-ep2: {shapes.experts} experts top-{shapes.top_k}, each {shapes.ffn} wide, "
              f"{shapes.shared_experts} shared, every block; experts over 2 ranks (ep 2 within dp 2)")
    print(f"MLP width {shapes.ffn} = torchtitan's rounding of int(2/3*4*{shapes.hidden}) = "
          f"{int(8 * shapes.hidden / 3)} up to multiple_of {shapes.multiple_of}; given to both exactly.")
    print(DIFFERENCES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
