"""A user's JSON file, read safely and checked against a JSON Schema before parc believes it.

Takes: a path and a JSON Schema (a profile's ``PROFILE_SCHEMA``, a build folder's
``MANIFEST_SCHEMA``). Gives: ``load_checked(path, schema)`` — the document, or
``InputError`` with one line naming the file, the JSON path of the first problem and
what is wrong in words (``profile.json: ["matmul"][2]["flops"]: must be > 0, not
0``); ``missing`` is set when there is no file at all (a CLI's exit 2), ``shape``
when the file is JSON of the wrong shape. Reading is
``runtime/paths.py``'s ``read_json``: a regular file of at most 64 MiB, UTF-8, finite
numbers (no ``NaN``/``Infinity``). Before: the user's file. After:
``cost/hardware.py``, ``build.py``.
"""

from __future__ import annotations

import json
import os

import jsonschema

from parc.runtime.paths import MissingFile, UnreadableFile, json_path, read_json

TYPE_WORDS = {
    "object": "an object ({...})",
    "array": "a list ([...])",
    "number": "a number",
    "integer": "a whole number",
    "string": "a string",
    "boolean": "true or false",
    "null": "null",
}


class InputError(ValueError):
    """A JSON file that is unreadable or not of the shape its schema says."""

    def __init__(self, message: str, *, missing: bool = False, shape: str | None = None):
        super().__init__(message)
        self.missing = missing
        """There is no file at the path."""
        self.shape = shape
        """The document is JSON but not of the schema's shape: ``[\"matmul\"]: must be ...``."""


def load_checked(path: str | os.PathLike, schema: dict):
    """The document at ``path`` if it satisfies ``schema``; ``InputError`` saying why not."""
    try:
        document = read_json(path)
    except UnreadableFile as exc:
        raise InputError(str(exc), missing=isinstance(exc, MissingFile)) from None
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(document),
        key=lambda e: (json_path(e.absolute_path), e.validator != "type"),
    )
    if errors:
        more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        shape = f"{json_path(errors[0].absolute_path)}: {in_words(errors[0])}{more}"
        raise InputError(f"{path}: {shape}", shape=shape)
    return document


def in_words(error: jsonschema.ValidationError) -> str:
    """What a schema error means, in the words of a diagnostic."""
    value, rule, got = error.validator_value, error.validator, _show(error.instance)
    if rule == "type":
        wanted = [value] if isinstance(value, str) else value
        return f"must be {' or '.join(TYPE_WORDS.get(kind, kind) for kind in wanted)}, not {got}"
    if rule == "exclusiveMinimum":
        return f"must be > {value}, not {got}"
    if rule == "minimum":
        return f"must be >= {value}, not {got}"
    if rule == "required":
        missing = [name for name in value if name not in error.instance]
        return f"{json.dumps(missing[0])} is missing"
    if rule in ("enum", "const"):
        allowed = value if rule == "enum" else [value]
        return f"must be one of {', '.join(json.dumps(v) for v in allowed)}, not {got}"
    if rule == "minItems":
        return f"must have at least {value} entr{'y' if value == 1 else 'ies'}"
    if rule == "pattern":
        return f"{got} is not of the form {value}"
    return error.message


def _show(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
