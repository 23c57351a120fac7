"""One rank of a multi-rank runtime test (started by ``ranks.launch``).

    python rank_worker.py OUT_DIR LAYOUT...

Joins the job (mesh.init_distributed, gloo), runs the communication and layer checks
with the whole world as the tp group, then trains each named layout of
``runtime_loop.LAYOUTS`` for both archs, and writes ``OUT_DIR/rank{r}.json``:
``{"checks": {name: "ok" | traceback}, "layouts": {layout: {arch: result}}}``.
Checks compare with plain single-device modules in float64 on the same full tensors,
which every rank draws from one seed.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from embedding_sync_check import check_embedding_sync  # noqa: E402
from runtime_loop import LAYOUTS, train  # noqa: E402

from parc.runtime.distributed import comm, comm_scatter, exchange, mesh  # noqa: E402
from parc.runtime.parallel.tensor import layers  # noqa: E402
from parc.runtime.models import model  # noqa: E402

B, T, IN, OUT, VOCAB, PADDED = 2, 8, 12, 16, 13, 16


def full(*shape, seed):
    """The same float64 tensor on every rank."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _shard(full: torch.Tensor, group, dim: int, full_shape) -> torch.Tensor:
    """This rank's chunk of ``full`` along ``dim`` (``full`` must have ``full_shape``)."""
    if tuple(full.shape) != tuple(full_shape):
        raise ValueError(f"load_full: expected the full shape {tuple(full_shape)}, got {tuple(full.shape)}")
    size = dist.get_world_size(group)
    if full.shape[dim] % size:
        raise ValueError(f"cannot shard size {full.shape[dim]} over {size} ranks")
    return full.chunk(size, dim=dim)[dist.get_rank(group)]


@torch.no_grad()
def load_full(layer, weight, bias=None):
    """Copy this rank's shard of the full (unsharded) ``weight`` and ``bias`` into a layer of
    layers.py: a column-parallel linear's rows (and bias), a row-parallel one's columns (its
    bias whole), a vocab-parallel embedding's rows. (Initialization generates the shard
    directly, ``param_init.materialize_on``; this is the tests' way to a given full tensor.)"""
    row = isinstance(layer, layers.RowParallelLinear)
    layer.weight.copy_(_shard(weight, layer.tp_group, 1 if row else 0, layer.full_shape))
    if getattr(layer, "bias", None) is not None:
        layer.bias.copy_(bias if row else _shard(bias, layer.tp_group, 0, layer.full_shape[:1]))


def check_mesh(dist_info):
    world = dist_info.world_size
    if world == 4:
        grid = mesh.Mesh((("dp", 2), ("tp", 2)), dist_info)
        r = dist_info.rank
        assert grid.coords == {"dp": r // 2, "tp": r % 2}
        assert grid.ranks("tp") == (r - r % 2, r - r % 2 + 1) and grid.ranks("dp") == (r % 2, r % 2 + 2)
        for axis in ("dp", "tp"):
            assert tuple(dist.get_process_group_ranks(grid.group(axis))) == grid.ranks(axis)
    grid = mesh.Mesh((("dp", 1), ("tp", world)), dist_info)
    assert grid.group("dp") is None and grid.size("tp") == world and grid.index("tp") == dist_info.rank
    return grid.group("tp")


# Each check runs all its collectives first and returns (what, actual, expected)
# triples, compared afterwards: a mismatch on one rank cannot desynchronize the others.


def check_comm(group):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    per_rank = [full(B, T, IN, seed=10 + i) for i in range(n)]  # rank i's input
    grads = [full(B, T, IN, seed=20 + i) for i in range(n)]  # rank i's upstream grad
    mine, chunk = per_rank[r], (lambda t: t.chunk(n, dim=1)[r])
    diagonal = lambda ts: torch.cat([t.chunk(n, dim=1)[i] for i, t in enumerate(ts)], dim=1)  # noqa: E731
    cases = [  # wrapper, input, upstream grad, expected output, expected input grad
        ("copy_to_group", comm.copy_to_group, mine, grads[r], mine, sum(grads)),
        ("reduce_from_group", comm.reduce_from_group, mine, grads[r], sum(per_rank), grads[r]),
        ("scatter_to_group", lambda x, g: comm_scatter.scatter_to_group(x, g, 1), per_rank[0], chunk(grads[r]),
         chunk(per_rank[0]), diagonal(grads)),
        ("gather_from_group", lambda x, g: comm_scatter.gather_from_group(x, g, 1), chunk(per_rank[0]), grads[0],
         per_rank[0], chunk(grads[0])),
        ("reduce_scatter_to_group", lambda x, g: comm_scatter.reduce_scatter_to_group(x, g, 1), mine,
         chunk(grads[r]), chunk(sum(per_rank)), diagonal(grads)),
        ("all_gather_from_group", lambda x, g: comm_scatter.all_gather_from_group(x, g, 1), chunk(mine), grads[r],
         diagonal(per_rank), chunk(sum(grads))),
    ]
    # all-to-all, Ulysses' exchange: dim 2 split over the ranks, the pieces gathered along T
    outs = [full(B, n * T, IN // n, seed=30 + i) for i in range(n)]  # rank i's upstream grad
    cases.append(("all_to_all", lambda x, g: exchange.all_to_all(x, g, 2, 1), mine, outs[r],
                  torch.cat([t.chunk(n, dim=2)[r] for t in per_rank], dim=1),
                  torch.cat([t.chunk(n, dim=1)[r] for t in outs], dim=2)))
    out = []
    for name, fn, x, grad, want_y, want_grad in cases:
        x = x.clone().requires_grad_()
        y = fn(x, group)
        y.backward(grad)
        out += [(f"{name} forward", y, want_y), (f"{name} backward", x.grad, want_grad)]
    return out


def check_linear(group, kind, sp):
    """A column- or row-parallel layer against nn.Linear: output, input grad, weight/bias grads."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    ref = nn.Linear(IN, OUT).double()
    with torch.no_grad():
        ref.weight.copy_(full(OUT, IN, seed=1))
        ref.bias.copy_(full(OUT, seed=2))
    x, dy = full(B, T, IN, seed=3).requires_grad_(), full(B, T, OUT, seed=4)
    y_ref = ref(x)
    y_ref.backward(dy)
    cls = layers.ColumnParallelLinear if kind == "column" else layers.RowParallelLinear
    layer = cls(IN, OUT, bias=True, tp_group=group, sequence_parallel=sp).double()
    load_full(layer, ref.weight.detach(), ref.bias.detach())
    seq = lambda t: t.chunk(n, dim=1)[r] if sp else t  # noqa: E731
    feat = lambda t: t.chunk(n, dim=-1)[r]  # noqa: E731
    what = f"{cls.__name__}(sequence_parallel={sp})"
    if kind == "column":  # (B, T[/tp], IN) → (B, T, OUT/tp)
        x_local = seq(x.detach()).clone().requires_grad_()
        y = layer(x_local)
        y.backward(feat(dy))
        return [
            (f"{what} output", y, feat(y_ref.detach())),
            (f"{what} input grad", x_local.grad, seq(x.grad)),
            (f"{what} weight grad", layer.weight.grad, ref.weight.grad.chunk(n, dim=0)[r]),
            (f"{what} bias grad", layer.bias.grad, ref.bias.grad.chunk(n)[r]),
        ]
    x_local = feat(x.detach()).clone().requires_grad_()  # (B, T, IN/tp) → (B, T[/tp], OUT)
    y = layer(x_local)
    y.backward(seq(dy))
    model.allreduce_sequence_parallel_grads(layer, group)  # under SP the bias saw a T shard
    return [
        (f"{what} output", y, seq(y_ref.detach())),
        (f"{what} input grad", x_local.grad, feat(x.grad)),
        (f"{what} weight grad", layer.weight.grad, ref.weight.grad.chunk(n, dim=1)[r]),
        (f"{what} bias grad", layer.bias.grad, ref.bias.grad),
    ]


def check_embedding(group, sp):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    table = full(PADDED, IN, seed=5)
    tokens = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(6))
    ref = nn.Embedding(PADDED, IN).double()
    with torch.no_grad():
        ref.weight.copy_(table)
    dy = full(B, T, IN, seed=7)
    y_ref = ref(tokens)
    y_ref.backward(dy)
    layer = layers.VocabParallelEmbedding(PADDED, IN, tp_group=group, sequence_parallel=sp).double()
    load_full(layer, table)
    seq = lambda t: t.chunk(n, dim=1)[r] if sp else t  # noqa: E731
    y = layer(tokens)
    y.backward(seq(dy))
    what = f"VocabParallelEmbedding(sequence_parallel={sp})"
    return [
        (f"{what} output", y, seq(y_ref.detach())),
        (f"{what} weight grad", layer.weight.grad, ref.weight.grad.chunk(n)[r]),
    ]


def check_cross_entropy(group):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    logits = (3 * full(B, T, PADDED, seed=8)).requires_grad_()
    targets = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(9))
    dloss = full(B, T, seed=10)
    ref = F.cross_entropy(logits[..., :VOCAB].flatten(0, 1), targets.flatten(), reduction="none").view(B, T)
    ref.backward(dloss)
    local = logits.detach().chunk(n, dim=-1)[r].clone().requires_grad_()
    loss = layers.vocab_parallel_cross_entropy(local, targets, tp_group=group, vocab_size=VOCAB)
    loss.backward(dloss)
    return [
        ("vocab_parallel_cross_entropy loss", loss, ref.detach()),
        ("vocab_parallel_cross_entropy logits grad", local.grad, logits.grad.chunk(n, dim=-1)[r]),
    ]


def main(out_dir: Path, layouts: list[str]) -> None:
    dist_info = mesh.init_distributed()
    result = {"checks": {}, "layouts": {}}

    def attempt(name, fn, *args):
        try:
            for what, actual, expected in fn(*args):
                torch.testing.assert_close(actual.detach(), expected.detach(), rtol=1e-12, atol=1e-12,
                                           msg=lambda m, what=what: f"{what}: {m}")
            result["checks"][name] = "ok"
        except Exception:  # recorded per check and reported by the test
            result["checks"][name] = traceback.format_exc()

    group = check_mesh(dist_info)
    attempt("comm", check_comm, group)
    for sp in (False, True):
        attempt(f"column-sp{int(sp)}", check_linear, group, "column", sp)
        attempt(f"row-sp{int(sp)}", check_linear, group, "row", sp)
        attempt(f"embedding-sp{int(sp)}", check_embedding, group, sp)
    attempt("cross-entropy", check_cross_entropy, group)
    if dist_info.world_size == 4:
        attempt("embedding-sync", check_embedding_sync, dist_info)
    for layout in layouts:
        dp_size, tp_size, sp, ends = LAYOUTS[layout]
        result["layouts"][layout] = {
            arch: train(arch, dist_info, dp_size=dp_size, tp_size=tp_size, sp=sp, replicated_ends=ends)
            for arch in ("gpt", "llama")
        }
    (out_dir / f"rank{dist_info.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
    mesh.shutdown()  # after main's objects are gone (Note in runtime/distributed/mesh.py)
