"""Ring attention: causal attention over a sequence split in load-balanced chunks over cp ranks.

Takes: this rank's q (B, H, 2c, D) and k, v (B, Hkv, 2c, D) for the 2c = T/cp tokens it
holds, chunks r and 2·cp−1−r of the sequence's 2·cp chunks of c tokens
(``data.context_spans``), and the cp group. Gives: ``ring_attention``, the rows of full
causal attention for those tokens, with its backward. ``context.py`` calls it for
``cp_kind = ring``; the block attention itself is ``kernels`` (``block_attention`` and its
backward, which takes the rows' final output and lse: the compiled ops, or the eager
reference).

Note [ring attention]: K/V blocks travel around the cp ring (rank r sends to r+1 and
receives from r−1), so at step j rank r holds the K/V of rank s = r − j. Its queries see
- step 0 (its own block): causal attention over its 2c tokens — the two chunks are in
  ascending order, so the plain causal mask is right;
- s < r: chunks s and 2·cp−1−s lie before chunk r and after chunk 2·cp−1−r resp., so all
  2c queries see chunk s wholly and none sees chunk 2·cp−1−s: (2c queries) × (c keys);
- s > r: the first query chunk r sees neither key chunk; the second, 2·cp−1−r, sees both
  wholly: (c queries) × (2c keys).
Every step after the first costs the same 2c·c scores on every rank: the load balance.
Each step's partial output and log-sum-exp merge exactly (``merge``), in fp32 (fp64 for
fp64). The send of block j+1 is posted before block j's compute and waited for after it.
Under documents = separate each step's scores are also masked where query and key lie in
different documents (``same``, per step, from the ids every rank holds); a query row
that sees no key of a block gives it lse −∞ and output 0, which merge exactly, and every
row sees at least itself at step 0.

Note [ring attention with dropout]: attention dropout multiplies each weight softmax(s)ᵢⱼ
by Zᵢⱼ, 0 with probability p and 1/(1 − p) otherwise. The block steps keep the exact lse
merge: a block's lse is of its scores, whatever Z, and its partial output is (Z ⊙ P) v over
the block's own softmax P, so the merge gives (Z ⊙ softmax(s)) v over the whole row. Z of
the queries of chunk a against the keys of chunk b (of the 2·cp chunks) is drawn from a
generator seeded by (seed, a, b) (``chunk_keep``), where the seed is drawn once a call from
the default generator (so checkpoints' RNG states and selective recompute's replay give the
same one); backward regenerates the same Z for each block instead of keeping it. Each
mask belongs to one query rank, so forward and backward of a block always meet the same
Z. These steps run the eager reference (the compiled block kernels take no mask).

Backward passes K/V around again with their gradient: at step j rank r adds its share
of dK, dV of block s = r − j to the partial sum that rank r−1 sent it (the sum over
ranks r−j .. r−1), and sends the sum on to r+1; after cp steps each sum arrives at its
block's owner. The next K/V block's transfer overlaps the step's compute, the partial
sum's transfer the next step's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...distributed.comm import group_rank, group_size


class _Ring:
    """Point-to-point sends to the next rank of the cp group and receives from the previous one."""

    def __init__(self, group):
        self.group, self.size, self.rank = group, group_size(group), group_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def shift(self, x: torch.Tensor, tag: int):
        """Start sending ``x`` to the next rank and receiving the previous rank's; ``.wait()`` gives it."""
        received = torch.empty_like(x)
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, x.contiguous(), self.next, self.group, tag),
            dist.P2POp(dist.irecv, received, self.prev, self.group, tag),
        ])
        return _Shifted(works, received)


class _Shifted:
    def __init__(self, works, received):
        self.works, self.received = works, received

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        return self.received


_KV, _GRAD = 0, 1
"""Tags of the two kinds of ring message (gloo matches by tag; NCCL by order, the same on every rank)."""


def _part(step, rank, size):
    """(causal, query rows, key rows) of ring step ``step`` on ``rank``, each rows one of
    ``"all"``, ``"first"`` or ``"second"`` of the local two chunks (Note [ring attention])."""
    if step == 0:
        return True, "all", "all"
    if (rank - step) % size < rank:  # the block of an earlier rank: its first chunk, for every query
        return False, "all", "first"
    return False, "second", "all"  # a later rank's block: both its chunks, for the second query chunk


def _rows(t, which, c):
    """The tokens (dim 2 of (B, H, 2c, ...)) of ``t`` that ``which`` names."""
    if which == "first":
        return t[:, :, :c]
    if which == "second":
        return t[:, :, c:]
    return t


def merge(out, lse, block_out, block_lse):
    """Fold a block's (out, lse) into the running ones over other key blocks, in place:
    lse' = log(e^lse + e^block_lse), out' = out·e^(lse−lse') + block_out·e^(block_lse−lse')."""
    new = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - new).unsqueeze(-1)).add_(block_out * torch.exp(block_lse - new).unsqueeze(-1))
    lse.copy_(new)


def _cols(t, which, c):
    """The keys (dim 3 of a (B, 1, 2c, 2c) mask) of ``t`` that ``which`` names."""
    if which == "first":
        return t[..., :c]
    if which == "second":
        return t[..., c:]
    return t


def _same(same, step, rows, keys, c):
    """Step ``step``'s same-document mask cut to its rows and keys, or None (documents joined)."""
    return None if same is None else _cols(_rows(same[step], rows, c), keys, c)


def chunk_keep(seed: int, a: int, b: int, shape, p: float, dtype, device) -> torch.Tensor:
    """Z for the queries of chunk ``a`` against the keys of chunk ``b``: 0 with probability
    ``p``, else 1/(1 − p) (Note [ring attention with dropout])."""
    generator = torch.Generator(device=device).manual_seed((seed + a * 65_537 + b) % 2**63)
    kept = torch.rand(shape, generator=generator, device=device) >= p
    return kept.to(dtype) / (1 - p)


def _keep(dropout, step, rank, size, rows, keys, q):
    """Step ``step``'s Z for its query ``rows`` and key ``keys`` on ``rank``, or None."""
    if dropout is None:
        return None
    p, seed = dropout
    B, H, two_c = q.shape[:3]
    c = two_c // 2
    owner = (rank - step) % size
    chunks = {"first": (rank,), "second": (2 * size - 1 - rank,), "all": (rank, 2 * size - 1 - rank)}
    key_chunks = {"first": (owner,), "second": (2 * size - 1 - owner,), "all": (owner, 2 * size - 1 - owner)}
    stats = torch.float64 if q.dtype == torch.float64 else torch.float32
    return torch.cat([
        torch.cat([chunk_keep(seed, a, b, (B, H, c, c), p, stats, q.device) for b in key_chunks[keys]], dim=-1)
        for a in chunks[rows]], dim=-2)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, scale, kernels, same, dropout):
        ring = _Ring(group)
        c = q.shape[2] // 2
        kv = torch.stack((k, v))  # one message: (2, B, Hkv, 2c, D)
        out = lse = None
        for step in range(ring.size):
            pending = ring.shift(kv, _KV) if step < ring.size - 1 else None
            causal, rows, keys = _part(step, ring.rank, ring.size)
            block_out, block_lse = kernels.block_attention(
                _rows(q, rows, c), _rows(kv[0], keys, c), _rows(kv[1], keys, c), causal, scale,
                **_allowed(_same(same, step, rows, keys, c)), **_kept(dropout, step, ring, rows, keys, q),
            )
            if out is None:
                out, lse = block_out, block_lse  # step 0 covers every row (each sees itself)
            else:
                merge(_rows(out, rows, c), _rows(lse, rows, c), block_out, block_lse)
            if pending is not None:
                kv = pending.wait()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale, ctx.kernels, ctx.same, ctx.dropout = group, scale, kernels, same, dropout
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale, kernels = _Ring(ctx.group), ctx.scale, ctx.kernels
        c = q.shape[2] // 2
        dq = torch.zeros_like(out)
        kv = torch.stack((k, v))
        sent = None  # the partial dK, dV sum travelling to the next rank
        for step in range(ring.size):
            pending = ring.shift(kv, _KV) if step < ring.size - 1 else None
            causal, rows, keys = _part(step, ring.rank, ring.size)
            block_dq, block_dk, block_dv = kernels.block_attention_backward(
                _rows(grad, rows, c), _rows(q, rows, c), _rows(kv[0], keys, c), _rows(kv[1], keys, c),
                _rows(out, rows, c), _rows(lse, rows, c), causal, scale,
                **_allowed(_same(ctx.same, step, rows, keys, c)), **_kept(ctx.dropout, step, ring, rows, keys, q),
            )
            _rows(dq, rows, c).add_(block_dq)
            dkv = torch.zeros((2, *k.shape), dtype=out.dtype, device=k.device)
            _rows(dkv[0], keys, c).add_(block_dk)
            _rows(dkv[1], keys, c).add_(block_dv)
            if sent is not None:
                dkv += sent.wait()  # ranks r−step .. r−1's share of this block's gradient
            sent = ring.shift(dkv, _GRAD)
            if pending is not None:
                kv = pending.wait()
        dkv = sent.wait()  # this rank's own block, summed over every rank's queries
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None


def _allowed(mask):
    """The block kernels' extra argument: nothing when documents are joined (the compiled
    kernels take none), else the same-document mask (the eager reference's ``allowed``)."""
    return {} if mask is None else {"allowed": mask}


def _kept(dropout, step, ring, rows, keys, q):
    """The block kernels' dropout argument: nothing without dropout (the compiled kernels
    take none), else the step's Z (the eager reference's ``keep``)."""
    return {} if dropout is None else {"keep": _keep(dropout, step, ring.rank, ring.size, rows, keys, q)}


def draw_seed() -> int:
    """The seed of one ring call's dropout masks, from the default generator."""
    return int(torch.randint(2**62, (1,)))


def ring_attention(q, k, v, group, scale, kernels, same=None, dropout=None):
    """Causal attention of this rank's load-balanced tokens against the whole sequence
    (Note [ring attention]); ``kernels``: a module with ``block_attention`` and
    ``block_attention_backward`` (``kernels.ops`` or ``kernels.reference``; the reference
    when ``same`` is given: per step, where query and key share a document; or when
    ``dropout`` is: (p, seed), Note [ring attention with dropout])."""
    return _RingAttention.apply(q, k, v, group, scale, kernels, same, dropout)
