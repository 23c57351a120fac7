"""Training samples by global index, the same whatever the layout.

Takes: a vocabulary size, sequence length and seed (and a token file, a user's input:
``runtime/paths.py`` checks it is a regular file). Gives:
``.batch(indices) -> (inputs, targets)`` (of a ``TokenFile``, synthetic data, or a
``BlendedTokens`` of several), int64 (N, T), targets shifted by one, and under
``documents = "separate"`` a third (N, T) tensor: each input token's document id
(Note [documents of a sample]), and
``sample_indices``, which says which global indices a rank reads, and ``context_spans`` /
``context_chunk``, the part of each sequence a context-parallel rank holds. Because a sample
depends only on (seed, index), every layout sees the same data in each step.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..paths import UnreadableFile, check_regular


def _generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 6_364_136_223_846_793_005 + index * 1_442_695_040_888_963_407) % (2**63))


def sample_indices(step, micro, *, micro_batch, grad_accum, dp_rank, dp_size):
    """Global sample indices of micro-batch ``micro`` (0-based) of ``step`` (1-based) on one dp rank.

    A step reads ``range((step-1)·G, step·G)``, G = micro_batch·grad_accum·dp_size:
    micro-batch m of dp rank r takes the m·dp_size + r-th block of micro_batch samples.
    """
    per_step = micro_batch * grad_accum * dp_size
    first = (step - 1) * per_step + (micro * dp_size + dp_rank) * micro_batch
    return list(range(first, first + micro_batch))


def context_spans(T, *, cp_rank, cp_size, cp_kind):
    """The global positions [start, stop) this context-parallel rank holds of a T-token
    sequence, in the order it holds them (Note [context-parallel attention]).

    ``ulysses`` and ``allgather``: one contiguous chunk [r·T/cp, (r+1)·T/cp). ``ring``
    (causal load balancing, as Megatron and torchtitan): T splits into 2·cp chunks of
    T/(2·cp) and rank r holds chunks r and 2·cp−1−r, so every rank has as many early
    (cheap) as late (costly) queries and every ring step the same work.
    """
    parts = 2 * cp_size if cp_kind == "ring" else cp_size
    if T % parts:
        raise ValueError(f"sequences of {T} tokens do not split into {parts} chunks (cp = {cp_size}, {cp_kind})")
    size = T // parts
    chunks = (cp_rank, parts - 1 - cp_rank) if cp_kind == "ring" else (cp_rank,)
    return tuple((c * size, (c + 1) * size) for c in chunks)


def context_chunk(inputs, targets, *, cp_rank, cp_size, cp_kind):
    """This context-parallel rank's T/cp tokens of every sequence, (B, T/cp) each: the
    spans ``context_spans`` names, of the inputs and of their targets, joined."""
    spans = context_spans(inputs.shape[1], cp_rank=cp_rank, cp_size=cp_size, cp_kind=cp_kind)
    return tuple(torch.cat([t[:, start:stop] for start, stop in spans], dim=1).contiguous() for t in (inputs, targets))


# Note [documents of a sample]: under model.documents = separate a dataset yields with
# each sample the id of the document of each input token, nondecreasing along the
# sequence (runtime/models/documents.py masks and positions by them). A token file's
# documents are those of its OUT.idx (each document's first token; parc data prepare
# writes it beside OUT.bin): a window's ids count the documents that start before
# each token. Synthetic data has no text, so its documents are drawn: after each token a
# new document starts with probability 4 / seq_len (about four a sequence), from a
# generator of (seed, index) of its own, so the tokens are the same as joined.


def documents_of(starts: torch.Tensor) -> torch.Tensor:
    """(T,) bool: a document starts at this token → (T,) int64 document ids from 0."""
    return starts.to(torch.int64).cumsum(0) - int(starts[0])


class SyntheticTokens:
    """Sequences from a fixed sparse Markov chain, so the loss visibly falls.

    The chain (from ``seed``) gives each token 4 likely successors (weights 8:4:2:1),
    drawn from a Zipf(1.5) law over a shuffled vocabulary, and with probability 1/8 a
    step goes anywhere. So a few tokens are common (learned within a few steps) and
    each token's successors are its own (learned later), down to about 2 nats per
    token from ln(vocab). Sample i starts at a token drawn from (seed, i) and is
    walked with a generator seeded by (seed, i) alone.
    """

    def __init__(self, vocab: int, seq_len: int, seed: int, documents: str = "joined"):
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed
        self.documents = documents == "separate"  # Note [documents of a sample]
        chain = torch.Generator().manual_seed(seed)
        zipf = torch.arange(1, vocab + 1, dtype=torch.float64).pow(-1.5)
        common = torch.randperm(vocab, generator=chain)  # which ids are the common ones
        picks = torch.multinomial(zipf, vocab * 4, replacement=True, generator=chain)
        self.successors = common[picks].view(vocab, 4).tolist()
        self.weights = torch.tensor([8.0, 4.0, 2.0, 1.0])

    def sample(self, index: int) -> torch.Tensor:
        """Token ids (seq_len + 1,) of sample ``index``: inputs and, shifted, targets."""
        gen = _generator(self.seed, index)
        first = int(torch.randint(0, self.vocab, (1,), generator=gen))
        choice = torch.multinomial(self.weights, self.seq_len, replacement=True, generator=gen).tolist()
        jump = (torch.rand(self.seq_len, generator=gen) < 0.125).tolist()
        anywhere = torch.randint(0, self.vocab, (self.seq_len,), generator=gen).tolist()
        tokens = [first]
        for t in range(self.seq_len):
            tokens.append(anywhere[t] if jump[t] else self.successors[tokens[-1]][choice[t]])
        return torch.tensor(tokens, dtype=torch.int64)

    def batch(self, indices):
        rows = torch.stack([self.sample(i) for i in indices])  # (N, T + 1)
        if not self.documents:
            return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous(), torch.stack([self.document_ids(i) for i in indices])

    def document_ids(self, index: int) -> torch.Tensor:
        """(seq_len,) document ids of sample ``index``'s inputs (Note [documents of a sample])."""
        gen = _generator(self.seed ^ 0x5EED, index)  # not the tokens' generator: their draws stay
        starts = torch.rand(self.seq_len, generator=gen) < 4.0 / self.seq_len
        starts[0] = True
        return documents_of(starts)

class TokenFile:
    """A flat file of uint16/uint32 token ids (nanoGPT style); sample i is a window.

    The window of sample i starts at an offset drawn from a generator seeded by
    (seed, i), so it depends on nothing but the file, the seed and i. The file is
    checked whole before training starts (``check_tokens``): a bad one ends the run in
    one line naming it, from ``rank`` 0 only.
    """

    def __init__(self, path: str, seq_len: int, dtype: str = "uint16", seed: int = 0, vocab: int | None = None,
                 rank: int = 0, part: tuple[float, float] = (0.0, 1.0), documents: str = "joined"):
        """``part``: the fraction of the file windows are drawn from (Note [held-out tail]);
        ``documents = "separate"``: read its OUT.idx too (Note [documents of a sample])."""
        torch_dtype = {"uint16": torch.uint16, "uint32": torch.uint32}[dtype]
        itemsize = 2 if dtype == "uint16" else 4
        try:
            size = check_regular(path).st_size
        except UnreadableFile as exc:
            raise _end(f"--data {exc}", rank) from None
        count = size // itemsize
        if size % itemsize:
            raise _end(f"--data {path}: {size} bytes is not a whole number of {dtype} tokens "
                       f"({itemsize} bytes each): not a {dtype} token file", rank)
        if count < seq_len + 2:
            raise _end(f"--data {path}: {count} tokens, fewer than seq_len + 2 = {seq_len + 2}", rank)
        try:
            self.tokens = torch.from_file(path, shared=False, size=count, dtype=torch_dtype)
        except RuntimeError as exc:  # unreadable, or the file shrank since stat
            raise _end(f"--data {path}: cannot read it ({str(exc).splitlines()[0]})", rank) from None
        if vocab is not None:
            check_tokens(self.tokens, vocab, path, rank)
        self.seq_len, self.seed = seq_len, seed
        self.first, last = int(count * part[0]), int(count * part[1])
        self.count = last - self.first  # the tokens of this part
        self.offsets = None if documents != "separate" else _offsets(path, count, rank)
        if self.count < seq_len + 2:
            raise _end(f"--data {path}: its part {part} holds {self.count} tokens, fewer than seq_len + 2 = "
                       f"{seq_len + 2}: too small a file to hold out a validation tail", rank)

    def batch(self, indices):
        rows, starts = [], []
        for i in indices:
            gen = _generator(self.seed, i)
            # any window of seq_len + 1 tokens that fits: start in [0, count - seq_len - 1]
            start = self.first + int(torch.randint(0, self.count - self.seq_len, (1,), generator=gen))
            rows.append(self.tokens[start : start + self.seq_len + 1].to(torch.int64))
            starts.append(start)
        rows = torch.stack(rows)
        if self.offsets is None:
            return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        positions = torch.tensor(starts).unsqueeze(1) + torch.arange(self.seq_len)  # (N, T) in the file
        ids = torch.searchsorted(self.offsets, positions, right=True)  # documents started at or before
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous(), ids - ids[:, :1]


class BlendedTokens:
    """Several token datasets read in fixed proportions (a blend: ``weights`` > 0).

    Sample i of the blend is sample j of dataset k, by ``locate(i)``, a function of i and
    the weights alone, so any layout and a resume under another one read the same
    samples (the data position stays the global sample index). Note [blend order]: the
    weights become whole counts per PERIOD samples (largest remainders, at least 1 each);
    within a period the samples are dealt to the dataset furthest below its share (ties to
    the first), so every prefix of the sequence holds each dataset within a sample or two of
    its share; period p's n-th sample of dataset k is that dataset's sample p·count_k + n.
    """

    PERIOD = 10_000

    def __init__(self, datasets, weights):
        if len(datasets) != len(weights) or not datasets or min(weights) <= 0:
            raise ValueError(f"a blend needs one positive weight per dataset, not {list(weights)}")
        self.datasets = list(datasets)
        self.counts = blend_counts(weights, self.PERIOD)
        dealt = [0] * len(self.counts)
        self.order = []  # (dataset, its sample within the period) of each position in a period
        for n in range(1, self.PERIOD + 1):
            k = max(range(len(dealt)), key=lambda d: (self.counts[d] * n / self.PERIOD - dealt[d], -d))
            self.order.append((k, dealt[k]))
            dealt[k] += 1

    def locate(self, index: int) -> tuple[int, int]:
        period, position = divmod(index, self.PERIOD)
        k, n = self.order[position]
        return k, period * self.counts[k] + n

    def batch(self, indices):
        parts = [self.datasets[k].batch([j]) for k, j in map(self.locate, indices)]
        return tuple(torch.cat(rows).contiguous() for rows in zip(*parts))


def blend(paths, weights, seq_len: int, dtype: str = "uint16", *, seed: int = 0, vocab: int | None = None,
          rank: int = 0, part: tuple[float, float] = (0.0, 1.0), documents: str = "joined") -> BlendedTokens:
    """The token files ``paths`` blended by ``weights`` (train.py's ``--data A B ...``); file k
    draws its windows with ``seed + k``, so two files' samples are not drawn alike."""
    if len(paths) != len(weights):
        raise _end(f"--data names {len(paths)} file{'s' * (len(paths) != 1)}, but the blend has {len(weights)} "
                   "weights (DATA_WEIGHTS): give one file per weight", rank)
    files = [TokenFile(path, seq_len, dtype, seed=seed + k, vocab=vocab, rank=rank, part=part, documents=documents)
             for k, path in enumerate(paths)]
    return BlendedTokens(files, weights)


def blend_counts(weights, period: int) -> list[int]:
    """``weights`` as whole counts summing to ``period``: each its share rounded down, the
    rest to the largest remainders (ties to the first), and none below 1."""
    total = float(sum(weights))
    shares = [w / total * period for w in weights]
    counts = [max(1, int(s)) for s in shares]
    by_remainder = sorted(range(len(shares)), key=lambda d: (-(shares[d] - int(shares[d])), d))
    for d in by_remainder[: max(0, period - sum(counts))]:
        counts[d] += 1
    while sum(counts) > period:  # the floors of 1 took too many: from the largest
        counts[max(range(len(counts)), key=lambda d: (counts[d], -d))] -= 1
    return counts


# Note [held-out tail]: with `eval` and no `val` file, training draws its windows from
# the first 90% of the token file and validation from the last 10% (HELD_OUT), so no
# validation window overlaps a training one.
HELD_OUT = 0.1
TRAIN_PART, VAL_PART = (0.0, 1.0 - HELD_OUT), (1.0 - HELD_OUT, 1.0)


class ValidationStream:
    """Synthetic data's validation samples: the training chain's, at indices training never
    reads (from ``FIRST``), so the two streams are disjoint and alike.

    A CPU generator keeps only the low 32 bits of its seed, and ``_generator``'s seed is
    an odd multiple of the index plus a constant, a bijection on the index modulo 2**32:
    training samples below 2**31 and validation samples from 2**31 (up to 2**31 of each)
    never share a seed. An offset of 2**48 would alias every sample.
    """

    FIRST = 1 << 31

    def __init__(self, dataset):
        self.dataset = dataset

    def batch(self, indices):
        return self.dataset.batch([self.FIRST + i for i in indices])


def check_tokens(tokens: torch.Tensor, vocab: int, path: str, rank: int = 0) -> None:
    """Every id is below ``vocab`` (the embedding would fail mid-run), else the run ends naming it."""
    largest = max(int(part.to(torch.int64).max()) for part in tokens.split(1 << 24))  # no max() on uint16
    if largest >= vocab:
        raise _end(f"--data {path}: holds token id {largest}, but the model's vocab is {vocab} "
                   f"(ids 0..{vocab - 1}): made for another vocabulary?", rank)


def _offsets(path: str, count: int, rank: int) -> torch.Tensor:
    """The document offsets of token file ``path`` (its OUT.idx: uint64, each document's
    first token), int64, checked ascending and inside the file's ``count`` tokens."""
    index = str(Path(path).with_suffix(".idx"))  # OUT.bin's OUT.idx
    try:
        size = check_regular(index).st_size
    except UnreadableFile as exc:
        raise _end(f"--data {path}: model.documents = separate reads each document's start from its .idx "
                   f"(parc data prepare writes it beside the .bin): {exc}", rank) from None
    if size % 8 or not size:
        raise _end(f"--data {index}: {size} bytes is not a list of uint64 document offsets", rank)
    offsets = torch.from_file(index, shared=False, size=size // 8, dtype=torch.uint64).to(torch.int64)
    if bool((offsets[1:] < offsets[:-1]).any()) or int(offsets[-1]) >= count or int(offsets[0]) < 0:
        raise _end(f"--data {index}: its document offsets are not ascending within the {count} tokens of {path}", rank)
    return offsets


def _end(message: str, rank: int) -> SystemExit:
    """End the run over a bad token file: every rank reads the same file and finds the
    same fault, so rank 0 says why in one line and the others exit 1 quietly."""
    return SystemExit(f"train.py: {message}" if rank == 0 else 1)
