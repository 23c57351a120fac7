"""One rank of the context-parallel tests (started by ``ranks.launch`` on 2 or 4 gloo ranks).

    python context_worker.py OUT_DIR [KINDS]

With all ranks as one cp group (2, or 4 for ring's load-balanced chunks), in float64, for GPT (learned positions) and
Llama (rotary, grouped-query heads) and each kind of KINDS (comma-separated; default ``ring,ulysses,allgather``):

- *attention*: block 0's attention (``Attention.mix``) on this rank's T/cp tokens of
  random q, k, v equals the same rows of full causal attention on one rank, and the
  gradients of q, k, v (from a random upstream gradient of the whole sequence) equal
  the full gradients' rows of this rank;
- *model*: the whole model on this rank's tokens (``data.context_chunk``), its loss
  averaged over cp, equals the one-rank loss, and every gradient averaged over cp
  equals the one-rank gradient;
- *dropout* (ring only): ring attention with attention dropout on this rank's tokens equals
  the rows of full causal attention whose weights are multiplied by the whole sequence's
  mask, assembled from ``ring.chunk_keep``'s chunk pairs (Note [ring attention with
  dropout]), forward and backward, and the mask drops about p of the weights.

Writes ``OUT_DIR/rank{r}.json``: ``{name: "ok" | traceback}``.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from runtime_loop import CONFIGS  # noqa: E402

from parc.runtime.train import data  # noqa: E402
from parc.runtime.distributed import mesh  # noqa: E402
from parc.runtime.models import model  # noqa: E402
import built  # noqa: E402  (tests/runtime/built.py)
from parc.runtime.parallel.context import ring  # noqa: E402
from parc.runtime.parallel.context.context import ContextParallel  # noqa: E402

B = 2


def build(arch, cp_group=None, kind=None):
    return built.build(CONFIGS[arch], tp_group=None, sequence_parallel=False, tp_plan={}, seed=5,
                             device=torch.device("cpu"), cp_group=cp_group, cp_kind=kind, kernels="eager").double()


def mine(x, group, kind):
    """This rank's tokens of ``x`` (B, T, ...) along T: ``data.context_spans``'s, joined."""
    spans = data.context_spans(x.shape[1], cp_rank=dist.get_rank(group), cp_size=dist.get_world_size(group),
                               cp_kind=kind)
    return torch.cat([x[:, start:stop] for start, stop in spans], dim=1)


def check_attention(group, arch, kind):
    config = CONFIGS[arch]
    T, D = config.seq_len, config.hidden // config.heads
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, T, heads * D, generator=gen, dtype=torch.float64)
               for heads in (config.heads, config.kv_heads, config.kv_heads))
    upstream = torch.randn(B, T, config.heads * D, generator=gen, dtype=torch.float64)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = build(arch).layers["0"].attn.mix(*full)
    expected.backward(upstream)
    local = [mine(t, group, kind).clone().requires_grad_() for t in (q, k, v)]
    got = build(arch, group, kind).layers["0"].attn.mix(*local)
    got.backward(mine(upstream, group, kind))
    torch.testing.assert_close(got, mine(expected, group, kind), rtol=1e-12, atol=1e-12)
    for name, g, want in zip("qkv", local, full):
        torch.testing.assert_close(g.grad, mine(want.grad, group, kind), rtol=1e-10, atol=1e-12, msg=f"d{name}")


def check_dropout(group, arch, kind, p=0.3):
    config = CONFIGS[arch]
    T, D, H, Hkv = config.seq_len, config.hidden // config.heads, config.heads, config.kv_heads
    size = dist.get_world_size(group)
    gen = torch.Generator().manual_seed(4)
    q, k, v, upstream = (torch.randn(B, heads, T, D, generator=gen, dtype=torch.float64)
                         for heads in (H, Hkv, Hkv, H))
    torch.manual_seed(11)
    seed = ring.draw_seed()  # what the ring call below draws
    c = T // (2 * size)
    keep = torch.cat([torch.cat([ring.chunk_keep(seed, a, b, (B, H, c, c), p, torch.float64, q.device)
                                 for b in range(2 * size)], dim=-1) for a in range(2 * size)], dim=-2)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    scores = full[0] @ full[1].repeat_interleave(H // Hkv, dim=1).transpose(-1, -2) * D**-0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    expected = (scores.softmax(-1) * keep) @ full[2].repeat_interleave(H // Hkv, dim=1)
    expected.backward(upstream)
    rows = lambda t: mine(t.transpose(1, 2), group, kind).transpose(1, 2)  # noqa: E731 - this rank's tokens
    local = [rows(t).clone().requires_grad_() for t in (q, k, v)]
    context = ContextParallel(group, kind)
    torch.manual_seed(11)
    got = context.ring(*local, dropout=p)
    got.backward(rows(upstream))
    torch.testing.assert_close(got, rows(expected), rtol=1e-12, atol=1e-12)
    for name, g, want in zip("qkv", local, full):
        torch.testing.assert_close(g.grad, rows(want.grad), rtol=1e-10, atol=1e-12, msg=f"d{name}")
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    dropped = (keep[..., causal] == 0).double().mean().item()
    assert abs(dropped - p) < 0.05, dropped
    torch.manual_seed(11)
    assert not torch.equal(context.ring(*local, dropout=0.0), got)  # the mask is applied


def check_model(group, arch, kind):
    config = CONFIGS[arch]
    inputs, targets = data.SyntheticTokens(config.vocab, config.seq_len, seed=7).batch(list(range(B)))
    reference = build(arch)
    expected = reference(inputs, targets)
    expected.backward()
    net = build(arch, group, kind)
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    loss = net(*data.context_chunk(inputs, targets, cp_rank=rank, cp_size=size, cp_kind=kind))
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    torch.testing.assert_close(total / size, expected.detach(), rtol=1e-12, atol=0)
    wanted = dict(reference.named_parameters())
    for name, param in net.named_parameters():
        grad = param.grad.clone()
        dist.all_reduce(grad, group=group)
        torch.testing.assert_close(grad / size, wanted[name].grad, rtol=1e-9, atol=1e-12, msg=name)


def main(out_dir: Path, kinds: tuple[str, ...]) -> None:
    dist_info = mesh.init_distributed()
    group = dist.new_group(list(range(dist_info.world_size)))
    result = {}
    for arch in ("gpt", "llama"):
        for kind in kinds:
            checks = (("attention", check_attention), ("model", check_model))
            for name, check in checks + ((("dropout", check_dropout),) if kind == "ring" else ()):
                try:
                    check(group, arch, kind)
                    result[f"{name} {arch} {kind}"] = "ok"
                except Exception:  # recorded per check and reported by the test
                    result[f"{name} {arch} {kind}"] = traceback.format_exc()
    (out_dir / f"rank{dist_info.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("ring", "ulysses", "allgather"))
    mesh.shutdown()  # after main's objects are gone (Note in runtime/distributed/mesh.py)
