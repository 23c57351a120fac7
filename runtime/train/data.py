"""Training samples by global index, the same whatever the layout.

Takes: a vocabulary size, sequence length and seed (and a token file, a user's input:
``runtime/paths.py`` checks it is a regular file). Gives:
``.batch(indices) -> (inputs, targets)`` (of a ``TokenFile``, synthetic data, or a
``BlendedTokens`` of several), int64 (N, T), targets shifted by one, and under
``documents = "separate"`` a third (N, T) tensor: each input token's document id
(Note [documents of a sample]), and
``sample_indices``, which says which global indices a rank reads. Because a sample
depends only on (seed, index), every layout sees the same data in each step.

Note [data by feature]: the token files' reader (``TokenFile``, ``blend``, the held-out
parts: ``train/tokens.py``) ships only with ``data = tokens(...)``, and the chunks of a
sequence a context-parallel rank holds (``context_spans`` / ``context_chunk``) live with
cp's transform (``parallel/context/context.py``), synthetic data's ``ValidationStream`` with
evaluation (``train/validation.py``); ``data.<name>`` still gives them, imported when first
asked for (``__getattr__``), so train.py names every dataset the same way.
"""

from __future__ import annotations

import torch

from .draws import sample_generator as _generator

TOKEN_NAMES = ("TokenFile", "BlendedTokens", "blend", "blend_counts", "check_tokens", "HELD_OUT", "TRAIN_PART",
               "VAL_PART")
"""What ``data.<name>`` gives from ``tokens.py`` (Note [data by feature])."""


def __getattr__(name: str):
    """Note [data by feature]: the token files' names from ``tokens.py``, cp's chunks from
    ``parallel/context/context.py``, ``ValidationStream`` from ``validation.py``, each
    imported when first asked for."""
    if name in TOKEN_NAMES:
        from . import tokens

        return getattr(tokens, name)
    if name in ("context_spans", "context_chunk"):
        from ..parallel.context import context

        return getattr(context, name)
    if name == "ValidationStream":
        from .validation import ValidationStream

        return ValidationStream
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def sample_indices(step, micro, *, micro_batch, grad_accum, dp_rank, dp_size):
    """Global sample indices of micro-batch ``micro`` (0-based) of ``step`` (1-based) on one dp rank.

    A step reads ``range((step-1)·G, step·G)``, G = micro_batch·grad_accum·dp_size:
    micro-batch m of dp rank r takes the m·dp_size + r-th block of micro_batch samples.
    """
    per_step = micro_batch * grad_accum * dp_size
    first = (step - 1) * per_step + (micro * dp_size + dp_rank) * micro_batch
    return list(range(first, first + micro_batch))


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
