"""Token files as datasets: sample i is a window of a flat file of token ids (``data =
tokens(...)``), several files blended, and the held-out tail of Note [held-out tail].

Takes: a token file's path (a user's input: ``runtime/paths.py`` checks it is a regular
file), the sequence length, dtype and seed. Gives: ``TokenFile``, ``BlendedTokens``,
``blend``, ``blend_counts``, ``check_tokens``, ``TRAIN_PART`` / ``VAL_PART``, reached as
``data.<name>`` (Note [data by feature] in data.py: shipped only with token data).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..paths import UnreadableFile, check_regular
from .draws import sample_generator as _generator


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
