"""``parc data prepare --tokenizer``: text through a Hugging Face ``tokenizers`` file.

Takes: the documents' bytes, the path of a local ``tokenizer.json`` (no network: the
file is the whole tokenizer), the end-of-text token (or the tokenizer's own), whether
to separate documents and the dtype asked for (None: chosen). Gives:
``TokenizerEncoder``: ``encode(piece)`` → the ids of one text, ``info(tokens)`` → the record
written beside the ``.bin``: ``tokenizer`` (the file's name), ``vocab_size``,
``separator`` (the end-of-text id), ``min_vocab`` (= ``vocab_size``, the largest id + 1: any id of the
tokenizer may appear in a later file, so a model needs them all; ``dsl/data_files.py``
refuses a smaller ``model.vocab``, PAR0120) and ``dtype``: uint32 when an id
passes 65,535 (``uint16`` asked for such a vocabulary is an error, not a wrap-around).
Before: ``codegen/cli/data.py`` reads the texts. After: it writes the files.
"""

from __future__ import annotations

from parc.runtime.paths import UnreadableFile, check_regular

END_OF_TEXT = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")
"""End-of-text tokens of common tokenizers, in the order looked for."""
UINT16_IDS = 65_536
UINT32_IDS = 2**32


class TokenizerError(ValueError):
    """One line for the user; ``status`` is the exit status (1 bad input, 2 usage)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def load_tokenizer(path: str):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizerError("--tokenizer needs the tokenizers package: pip install tokenizers", 2) from None
    try:
        check_regular(path)
    except UnreadableFile as exc:
        raise TokenizerError(f"--tokenizer {exc}", 2) from None
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception on a bad file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TokenizerError(f"--tokenizer {path}: not a tokenizers file ({first})") from None


def end_of_text_id(tokenizer, eot: str | None, path: str) -> int:
    names = (eot,) if eot is not None else END_OF_TEXT
    for name in names:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return token_id
    if eot is not None:
        raise TokenizerError(f"--eot {eot!r}: {path} has no such token")
    raise TokenizerError(
        f"{path} has none of the end-of-text tokens {', '.join(END_OF_TEXT)}: name its own with "
        "--eot TOKEN, or pass --no-separator"
    )


def id_bound(tokenizer) -> int:
    """The tokenizer's largest id + 1: what an embedding must hold and what decides the
    dtype. Not its entry count (``get_vocab_size``): a vocabulary's ids may have gaps
    (a WordLevel or added tokens with ids of their own), and an id past the count is still
    an id a file may hold."""
    ids = tokenizer.get_vocab(with_added_tokens=True).values()
    return max(ids, default=-1) + 1


class TokenizerEncoder:
    """A loaded tokenizer that encodes one text at a time (``codegen/corpus.py`` streams
    the documents through it); ``info`` is the record written beside the ``.bin``."""

    def __init__(self, path: str, *, eot: str | None, separator: bool, dtype: str | None):
        self.path = path
        self.tokenizer = load_tokenizer(path)
        self.vocab_size = id_bound(self.tokenizer)
        if self.vocab_size > UINT32_IDS:
            raise TokenizerError(f"{path} has ids up to {self.vocab_size - 1:,}: a token file holds ids below 2**32")
        self.separator_id = end_of_text_id(self.tokenizer, eot, path) if separator else None
        needed = "uint32" if self.vocab_size > UINT16_IDS else "uint16"
        if dtype == "uint16" and needed == "uint32":
            raise TokenizerError(
                f"--dtype uint16 holds ids below {UINT16_IDS:,}, but {path} has ids up to {self.vocab_size - 1:,}: "
                "use --dtype uint32 (or leave --dtype out)"
            )
        self.dtype = dtype or needed

    def encode(self, piece: bytes) -> list[int]:
        text = piece.decode("utf-8", errors="replace")
        encoded = self.tokenizer.encode(text, add_special_tokens=False).ids
        if encoded and max(encoded) >= self.vocab_size:  # pragma: no cover - an id outside get_vocab
            raise TokenizerError(f"{self.path} gave id {max(encoded):,}, past its vocabulary's {self.vocab_size - 1:,}")
        return encoded

    def info(self, tokens: int) -> dict:
        return {
            "tokenizer": self.path.replace("\\", "/").rsplit("/", 1)[-1],
            "vocab_size": self.vocab_size,
            "dtype": self.dtype,
            "tokens": tokens,
            "separator": self.separator_id,
            "min_vocab": self.vocab_size,
        }
