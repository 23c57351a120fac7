"""``--set block.key=value``: command-line values merged into a normalized document.

Takes: the ``Normalized`` document of a file (``.par`` or JSON) and the ``--set``
arguments in order. Gives: the same document with each override applied (the last
of several for one key wins), and the arguments' texts for the SourceMap, so their
errors render with a caret. The N-th argument is the file ``--set N`` in spans.

The value is read with the grammar of a value in a file and normalized like one;
the dotted key is exactly ``block.key`` (``parallel.tp``, ``train.steps``,
``model.name``), or ``parallel`` alone for ``--set parallel=auto``. Setting a key of
a ``parallel = auto`` block makes the block all-``auto`` except that key.

Before: ``dsl/normalize.py`` / ``dsl/jsonspec.py``. After: ``dsl/validate.py``.
"""

from __future__ import annotations

from typing import Sequence

from . import ast
from .diagnostics import Diagnostics, ParcError, Span, clip, did_you_mean
from .grammar import KEY_RE
from .keys import BLOCKS, PARALLEL
from .normalize import Normalized, Origin, set_value
from .parse import parse_override
from .reading import too_long
from .source import MAX_SOURCE_BYTES


def override_file(index: int) -> str:
    """The file name that spans into the ``index``-th (1-based) ``--set`` carry."""
    return f"--set {index}"


DEFAULT = "default"
"""``--set KEY=default``: the key as if the file did not write it (its default applies)."""


def apply_overrides(out: Normalized, overrides: Sequence[str]) -> dict[str, str]:
    """Apply ``overrides`` to ``out`` in place; return {file name: argument text}."""
    texts: dict[str, str] = {}
    for index, text in enumerate(overrides, start=1):
        file = override_file(index)
        texts[file] = text
        _apply_one(out, text, file)
    return texts


def _span(token, file: str) -> Span:
    return ast.span_between(file, token)


def _apply_one(out: Normalized, text: str, file: str) -> None:
    whole = Span(file=file, line=1, column=1, end_line=1, end_column=max(len(text), 1) + 1)
    if len(text) > MAX_SOURCE_BYTES // 4:  # a character is at most 4 bytes of UTF-8
        if len(text.encode("utf-8", errors="surrogatepass")) > MAX_SOURCE_BYTES:
            out.errors.append(((file,), too_long(file, "the argument")))
            return
    if "=" not in text or "\n" in text or "\r" in text:
        out.error(
            (file,),
            whole,
            "PAR0017",
            f"`--set {clip(text)}` is not `block.key=value`",
            "e.g. --set parallel.tp=2",
        )
        return
    try:
        key_token, value = parse_override(text, file)
    except Diagnostics as exc:
        for error in exc.errors:
            out.errors.append(((file,), error))
        return
    key_span = _span(key_token, file)
    parts = str(key_token).split(".")
    if len(parts) > 2 or not all(KEY_RE.fullmatch(part) for part in parts):
        out.error(
            (file,),
            key_span,
            "PAR0017",
            f"`{clip(str(key_token))}` is not a key",
            "a key is `block.key`, e.g. parallel.tp or train.steps",
        )
        return
    block = BLOCKS.get(parts[0])
    if block is None:
        near = did_you_mean(parts[0], BLOCKS)
        out.error(
            (file,),
            key_span,
            "PAR0115",
            f"unknown block `{clip(parts[0])}` in `--set {clip(str(key_token))}`",
            f"did you mean `{near}`?" if near else "blocks are " + ", ".join(BLOCKS),
        )
        return
    if len(parts) == 1:
        if block.may_be_auto and isinstance(value, ast.Auto):
            out.drop((block.name,))
            out.doc[block.name] = "auto"
            out.origins[(block.name,)] = Origin(span=value.span, key_span=key_span, text="auto")
            return
        out.error(
            (file,),
            key_span,
            "PAR0115",
            f"`--set {key_token}=...` names a whole block",
            f"set one key, e.g. --set {block.name}.{block.keys[0].name}=...",
        )
        return
    key_name = parts[1]
    if block.named and key_name == "name":
        _set_name(out, block.name, value, key_span)
        return
    param = block.key(key_name)
    if param is None:
        near = did_you_mean(key_name, [k.name for k in block.keys])
        out.error(
            (file,),
            key_span,
            "PAR0115",
            f"unknown key `{clip(key_name)}` in `--set {clip(str(key_token))}`",
            (
                f"did you mean `{block.name}.{near}`?"
                if near
                else f"{block.name} keys: " + ", ".join(k.name for k in block.keys)
            ),
        )
        return
    if isinstance(value, ast.Name) and value.name == DEFAULT:  # the key as if unwritten
        if param.default is None:
            out.error((file,), value.span, "PAR0115", f"`{block.name}.{key_name}` has no default to go back to",
                      f"give {block.name}.{key_name} a value")
            return
        if block is PARALLEL and out.doc.get(block.name) == "auto":
            _expand_auto(out)
        out.drop((block.name, key_name))
        if isinstance(out.doc.get(block.name), dict):
            out.doc[block.name].pop(key_name, None)
        return
    if block is PARALLEL and out.doc.get(block.name) == "auto":
        _expand_auto(out)
    if not isinstance(out.doc.get(block.name), dict):
        out.doc[block.name] = {}
        out.origins[(block.name,)] = Origin(span=key_span, text=block.name)
        out.bad.discard((block.name,))
    set_value(out, (block.name, key_name), param, value, key_span)


def _set_name(out: Normalized, block: str, value: ast.Value, key_span: Span) -> None:
    path = (block, "name")
    out.drop(path)
    if not isinstance(value, ast.Name) or not KEY_RE.fullmatch(value.name):
        out.errors.append(
            (
                path,
                ParcError(
                    span=value.span,
                    code="PAR0114",
                    message="a name is letters, digits and `_`",
                    hint=f"e.g. --set {block}.name=gpt_tiny",
                ),
            )
        )
        out.bad.add(path)
        return
    if not isinstance(out.doc.get(block), dict):
        out.doc[block] = {}
        out.origins[(block,)] = Origin(span=key_span, text=block)
    out.doc[block]["name"] = value.name
    out.origins[path] = Origin(span=value.span, key_span=key_span, text=value.name)


def _expand_auto(out: Normalized) -> None:
    """``parallel = auto`` → a block with every key ``auto`` (where ``auto`` was written)."""
    origin = out.origins[(PARALLEL.name,)]
    out.doc[PARALLEL.name] = {key.name: "auto" for key in PARALLEL.keys if key.auto and key.whole_auto}
    for key in PARALLEL.keys:
        if key.auto and key.whole_auto:
            out.origins[(PARALLEL.name, key.name)] = Origin(
                span=origin.span, key_span=origin.key_span, text="auto"
            )
