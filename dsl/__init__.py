"""parc's language front end: ``.par`` (or JSON) text → a checked ``Spec``.

The pipeline, one module a step::

    text ─ parse.py (grammar.lark) ─▶ ast.Document ─ normalize.py ─▶ normalized JSON
         (jsonspec.py for .json)        (fmt.py prints it back)       │ overrides.py (--set)
                                                                     ▼
    Spec ◀─ build_spec.py ◀─ checks.py (semantics) ◀─ validate.py (JSON Schema, schema.py)

Every problem is a ``ParcError`` (``diagnostics.py``); all of them are collected and
raised together as ``Diagnostics``. ``commands.py`` holds ``parc check``, ``parc fmt``
and ``parc schema``. The language is documented in docs/language.md.
"""

from __future__ import annotations

from typing import Sequence

from . import data_files, init_checkpoint
from .ast import Document, strip_spans
from .build_spec import spec_document, spec_to_dict
from .diagnostics import Diagnostics, ParcError, SourceMap, Span
from .fmt import dump, format_document
from .jsonspec import normalize_json
from .normalize import normalize_document
from .overrides import apply_overrides
from .parse import parse
from .reading import decode, read_text
from .schema import schema
from .source import no_collection
from .spec import Spec
from .validate import validate

__all__ = [
    "Diagnostics",
    "Document",
    "ParcError",
    "Spec",
    "check",
    "decode",
    "dump",
    "format_document",
    "load",
    "load_text",
    "parse",
    "read_text",
    "schema",
    "spec_document",
    "spec_to_dict",
    "strip_spans",
]


def load(path: str, overrides: Sequence[str] = (), *, buildable: bool = True) -> Spec:
    """The checked Spec of the file at ``path`` (``.par``, or ``.json`` for the
    normalized document), with ``--set`` ``overrides`` applied in order.

    Raises ``Diagnostics`` (with ``.sources``) for any problem in the text or the
    overrides, and ``OSError`` when the file cannot be read. ``buildable=False``
    accepts the features ``parc build`` cannot generate yet (``zero = 3``, ``fp16``:
    PAR0802), for ``parc plan``, which predicts them.
    """
    return load_text(read_text(path), path, overrides, buildable=buildable)


def check(path: str, overrides: Sequence[str] = (), *, buildable: bool = True) -> tuple[Spec, Diagnostics]:
    """``load``, and the warnings about the spec (Note [warnings]) as a ``Diagnostics``
    of warnings only, perhaps none, with the sources they quote. Raises as ``load``."""
    text = read_text(path)
    sources = SourceMap()
    spec = load_text(text, path, overrides, buildable=buildable, sources=sources)
    return spec, Diagnostics(data_files.warnings(spec) + init_checkpoint.warnings(spec), sources)


def load_text(
    text: str, file: str, overrides: Sequence[str] = (), *, buildable: bool = True, sources: SourceMap | None = None
) -> Spec:
    """Like ``load``, for ``text`` already in hand; ``file`` names it in messages
    (and, ending in ``.json``, says it is JSON). ``sources``, if given, receives the
    texts diagnostics quote."""
    if file.endswith(".json"):
        norm = normalize_json(text, file)
    else:
        with no_collection():  # Note [gc while parsing]: until the tree is dropped
            norm = normalize_document(parse(text, file, comments=False))
    sources = SourceMap() if sources is None else sources
    sources.add(file, text)
    for name, override in apply_overrides(norm, overrides).items():
        sources.add(name, override)
    spec = validate(norm, sources, file, buildable=buildable)
    refused = data_files.errors(spec)  # PAR0120: a tokenizer's file needs its whole vocabulary
    if refused:
        raise Diagnostics(refused, sources)
    return spec
