"""The JSON Schema of the normalized spec document, generated from ``dsl/keys/``.

Takes: the key table. Gives: ``schema()`` (a JSON Schema, draft 2020-12, that
``parc schema`` prints and editors use) and ``validator()`` (a jsonschema validator
for it whose "integer" excludes floats and booleans: ``layers = 4.0`` is refused).

The normalized document is what a ``.par`` file means, in JSON: one object per
block, units resolved to SI numbers (bytes, bytes/s, FLOP/s, seconds), ``auto`` as
the string ``"auto"``, a bare enum value as a string, and a call ``f(k = v)`` (or
the bare name ``f``) as ``{"kind": "f", "k": v}``. Before: ``dsl/normalize.py`` or
``dsl/jsonspec.py`` make such a document. After: ``dsl/validate.py`` checks it.
"""

from __future__ import annotations

import functools

import jsonschema

from .keys import BLOCKS, ELEMENT, NO_CONTROL, UNIT_TYPES, CallDef, Param

NAME_PATTERN = "^[A-Za-z_][A-Za-z0-9_]*$"


def _annotate(out: dict, param: Param) -> dict:
    out["description"] = param.doc
    return out


def _plain(param: Param) -> dict:
    """The schema of one value of ``param``, without ``auto``."""
    kind = param.type
    if kind == "int":
        out: dict = {"type": "integer"}
    elif kind in ("number", *UNIT_TYPES):
        out = {"type": "number"}
    elif kind == "bool":
        out = {"type": "boolean"}
    elif kind == "string":
        out = {"type": "string", "minLength": 1, "pattern": NO_CONTROL}
    elif kind == "enum":
        out = {"enum": list(param.choices)}
    elif kind == "int_list":
        return {"type": "array", "items": _plain(ELEMENT["int_list"]), "minItems": 1}
    elif kind in ("pair", "int_pair"):
        return {"type": "array", "items": _plain(ELEMENT[kind]), "minItems": 2, "maxItems": 2}
    elif kind == "call":
        return _call_schema(param.calls)
    else:  # pragma: no cover - the key table is ours
        raise ValueError(f"internal error in parc (schema): unknown type {kind!r}")
    for keyword, value in (
        ("minimum", param.minimum),
        ("exclusiveMinimum", param.exclusive_minimum),
        ("maximum", param.maximum),
        ("exclusiveMaximum", param.exclusive_maximum),
    ):
        if value is not None:
            out[keyword] = value
    return out


def _call_schema(calls: tuple[CallDef, ...]) -> dict:
    branches = []
    for call in calls:
        properties: dict = {"kind": {"const": call.name}}
        for param in call.params:
            properties[param.name] = _annotate(_or_list(param, _plain(param)), param)
        branches.append(
            {
                "if": {"properties": {"kind": {"const": call.name}}, "required": ["kind"]},
                "then": {
                    "properties": properties,
                    "required": ["kind", *(p.name for p in call.params if p.required)],
                    "additionalProperties": False,
                },
            }
        )
    return {
        "type": "object",
        "properties": {"kind": {"enum": [call.name for call in calls]}},
        "required": ["kind"],
        "allOf": branches,
    }


def _or_list(param: Param, plain: dict) -> dict:
    """``plain``, or also a list of two or more of ``param.or_list`` where it takes one."""
    if param.or_list is None:
        return plain
    return {"anyOf": [plain, {"type": "array", "items": _plain(param.or_list), "minItems": 2}]}


def _value(param: Param) -> dict:
    plain = _or_list(param, _plain(param))
    if param.per_layer:  # one value, or one per transformer block
        plain = {"anyOf": [plain, {"type": "array", "items": _plain(param), "minItems": 1}]}
    if param.or_none:
        plain = {"anyOf": [{"const": "none"}, plain]}
    out = {"anyOf": [{"const": "auto"}, plain]} if param.auto else plain
    if param.default is not None:
        out["$comment"] = f"default: {param.default}"
    return _annotate(out, param)


def _block(name: str) -> dict:
    block = BLOCKS[name]
    properties: dict = {}
    required = []
    if block.named:
        properties["name"] = {
            "type": "string",
            "pattern": NAME_PATTERN,
            "description": "the block's name",
        }
        required.append("name")
    for key in block.keys:
        properties[key.name] = _value(key)
        if key.required:
            required.append(key.name)
    out = {
        "type": "object",
        "description": block.doc,
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    if block.may_be_auto:
        return {"description": block.doc, "anyOf": [{"const": "auto"}, out]}
    return out


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "parc spec",
        "description": (
            "A parc training spec in normalized form: units in SI (bytes, bytes/s, "
            'FLOP/s, seconds), calls as {"kind": name, ...arguments}.'
        ),
        "type": "object",
        "properties": {name: _block(name) for name in BLOCKS},
        "required": list(BLOCKS),
        "additionalProperties": False,
    }


def schema() -> dict:
    """The JSON Schema (a fresh copy; callers may change it)."""
    import copy

    return copy.deepcopy(_schema())


def _is_integer(checker, instance) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.lru_cache(maxsize=1)
def validator() -> jsonschema.protocols.Validator:
    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine("integer", _is_integer)
    strict = jsonschema.validators.extend(base, type_checker=checker)
    return strict(_schema())
