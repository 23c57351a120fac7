"""Auxiliary-loss-free balancing on a short CPU run: max/mean expert load per step, with and without the bias.

One rank, a tiny llama (4 blocks, block 0 dense, 3 MoE blocks of 16 experts, top 2, sigmoid
router), trained with AdamW on the synthetic Markov data (a Zipf law over the vocabulary, so
a few tokens are common and the router learns to send them to a few experts). Both runs
have the same seed and no aux loss, so the only difference is ``router_bias_update``
(runtime/parallel/expert/router_bias.py, Note [auxiliary-loss-free balancing]): per step
the table gives the busiest expert's tokens over the mean, the worst MoE block's and the
mean over the MoE blocks, without and with the bias. A benchmark, not a test.

    python bench/moe_balance.py [--steps 100] [--rate 0.003]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parc.runtime.layout.model_desc import ModelConfig  # noqa: E402
from parc.runtime.models import model as models  # noqa: E402
from parc.runtime.parallel.expert import moe, router_bias  # noqa: E402
from parc.runtime.train.data import SyntheticTokens  # noqa: E402


def run(steps: int, rate: float, *, batch: int, seed: int) -> list[tuple[float, float]]:
    """(worst block's max/mean, mean over blocks) per step."""
    config = ModelConfig(arch="llama", layers=4, hidden=64, heads=4, kv_heads=4, ffn=128, vocab=512,
                         padded_vocab=512, seq_len=64, experts=16, top_k=2, expert_ffn=32, first_dense_layers=1,
                         router="sigmoid", aux_loss=0.0, router_bias_update=rate)
    torch.manual_seed(seed)
    net = models.use_kernels(models.init_weights(models.build_model(config), seed=seed, device="cpu"), "eager", "cpu")
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.0)
    data = SyntheticTokens(config.vocab, config.seq_len, seed)
    out = []
    for step in range(steps):
        inputs, targets = data.batch(range(step * batch, (step + 1) * batch))
        optimizer.zero_grad()
        net(inputs, targets).backward()
        optimizer.step()
        tokens = moe.step_metrics(net, config, micro_batches=1, stage_ranks=1, replicas=1, device="cpu")
        if rate:
            router_bias.update_router_bias(net, tokens["expert_tokens"])
        ratios = [router_bias.load_ratio(t) for t in tokens["expert_tokens"].values()]
        out.append((max(ratios), sum(ratios) / len(ratios)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rate", type=float, default=0.003, help="router_bias_update of the balanced run")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    torch.set_num_threads(1)
    plain = run(args.steps, 0.0, batch=args.batch, seed=args.seed)
    biased = run(args.steps, args.rate, batch=args.batch, seed=args.seed)
    print(f"max/mean expert load (1.00 = even; 16 experts, top 2, {args.batch}×64 tokens a step), "
          f"no aux loss; bias rate {args.rate:g}")
    print(f"{'step':>4}  {'no bias: worst':>14}  {'mean':>6}  {'bias: worst':>11}  {'mean':>6}")
    for step, ((p_worst, p_mean), (b_worst, b_mean)) in enumerate(zip(plain, biased), start=1):
        print(f"{step:>4}  {p_worst:>14.2f}  {p_mean:>6.2f}  {b_worst:>11.2f}  {b_mean:>6.2f}")
    last = max(1, args.steps // 4)
    tail = lambda rows, i: sum(r[i] for r in rows[-last:]) / last  # noqa: E731
    print(f"last {last} steps' mean: no bias {tail(plain, 1):.2f} (worst {tail(plain, 0):.2f}), "
          f"bias {tail(biased, 1):.2f} (worst {tail(biased, 0):.2f})")


if __name__ == "__main__":
    main()
