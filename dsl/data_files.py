"""What the spec's token file says about itself: the warnings of ``parc check``.

Takes: a checked ``Spec``. Gives: ``warnings(spec)``, a list of ``ParcError`` of
severity warning (Note [warnings] in ``dsl/diagnostics.py``), each at the spec's
``train.data``:

- PAR0218: the token file's record (``parc data prepare -o X.bin`` writes ``X.json``
  beside it) says it needs ``min_vocab`` ids, more than ``model.vocab``: the trainer
  would stop at its first step, its embedding having no row for them;
- PAR0219: there is no token file at the path (it may be made before the run);
- PAR0225: ``model.documents = separate`` with a token file that has no ``X.idx`` (the
  document starts ``parc data prepare`` writes beside ``X.bin``): the trainer would end
  at its start (``runtime/train/data.py``).

Each file of a blend (``tokens([...], weights = [...])``) is checked the same way.

And one error, ``errors(spec)``, which ``load`` raises (so ``parc check`` and ``parc
build`` both refuse the spec):

- PAR0120: the record says the file was made by a tokenizer (``parc data prepare
  --tokenizer``: ``vocab_size``) larger than ``model.vocab``. A tokenizer's vocabulary
  is a fact about every file it makes, not a guess about this one, so a model without
  a row for each of its ids is refused.

Warnings, not errors: the file is not the spec, and may change before the run; the
trainer checks every id against ``VOCAB`` at startup in any case (``runtime/train/data.py``).
A record that cannot be read or lacks ``min_vocab`` says nothing. Paths in a spec are
relative to the spec's folder (``Spec.resolve``). Before: ``validate``. After: the
command prints them.
"""

from __future__ import annotations

import os

from parc.runtime.paths import UnreadableFile, read_json

from .diagnostics import ParcError, Severity, Span
from .spec import DataKind, Spec


def _record(spec: Spec, written: str) -> dict | None:
    """The token file's record (``X.json`` beside ``X.bin``) as a dict, or None."""
    path = spec.resolve(written)
    record = os.path.splitext(path)[0] + ".json"
    if record == path or not os.path.isfile(record):
        return None
    try:
        content = read_json(record)
    except UnreadableFile:
        return None
    return content if isinstance(content, dict) else None


def _files(spec: Spec) -> tuple[str, ...]:
    """The spec's token files as written: one, or each file of a blend (each is checked alike)."""
    data = spec.train.data
    return data.files if data.kind == DataKind.TOKENS else ()


def token_records(spec: Spec) -> list[tuple[str, dict | None]]:
    """Each token file of the spec as written, with its record (None: none readable)."""
    return [(written, _record(spec, written)) for written in _files(spec)]


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def errors(spec: Spec) -> list[ParcError]:
    span = spec.span("train.data")
    return [] if span is None else [e for written in _files(spec) for e in _file_errors(spec, written, span)]


def _file_errors(spec: Spec, written: str, span: Span) -> list[ParcError]:
    record = _record(spec, written)
    if record is None or not _count(record.get("vocab_size")):
        return []
    size, vocab = record["vocab_size"], spec.model.vocab
    if size <= vocab:
        return []
    return [ParcError(
        span=span,
        code="PAR0120",
        message=f"{written} was made by the tokenizer {record.get('tokenizer')!s} of "
        f"{size:,} tokens, but the model's vocab is {vocab:,}: ids from {vocab:,} up have no embedding row",
        hint=f"set model.vocab to at least {size} (the tokenizer's vocabulary), or prepare the data "
        "with a smaller tokenizer",
    )]


def warnings(spec: Spec) -> list[ParcError]:
    span = spec.span("train.data")
    if span is None or errors(spec):  # a tokenizer's file: PAR0120 refuses the spec already
        return []
    return [w for written in _files(spec) for w in _file_warnings(spec, written, span)]


def _file_warnings(spec: Spec, written: str, span: Span) -> list[ParcError]:
    path = spec.resolve(written)
    if not os.path.exists(path):
        return [_warning(span, "PAR0219", f"no token file at {path}",
                         "paths in a spec are relative to the spec's folder; make the file before "
                         "the run (parc data prepare) or fix the path")]
    index = os.path.splitext(path)[0] + ".idx"
    if spec.model.documents == "separate" and (index == path or not os.path.isfile(index)):
        return [_warning(span, "PAR0225", f"model.documents = separate reads each document's start from "
                         f"{index}, which is not there", "make the file with parc data prepare (it writes "
                         "X.idx beside X.bin), or write model.documents = joined")]
    record = os.path.splitext(path)[0] + ".json"
    if record == path or not os.path.isfile(record):
        return []
    try:
        min_vocab = read_json(record).get("min_vocab")
    except (UnreadableFile, AttributeError):
        return []
    vocab = spec.model.vocab
    if not isinstance(min_vocab, int) or isinstance(min_vocab, bool) or min_vocab <= vocab:
        return []
    return [_warning(
        span,
        "PAR0218",
        f"{written} holds token ids up to {min_vocab - 1} ({record} says min_vocab = {min_vocab}), "
        f"but the model's vocab is {vocab}: the trainer would stop at its first step",
        f"set model.vocab to at least {min_vocab}",
    )]


def _warning(span: Span, code: str, message: str, hint: str) -> ParcError:
    return ParcError(span=span, code=code, message=message, hint=hint, severity=Severity.WARNING)
