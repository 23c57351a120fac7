"""The normalized document → a checked ``Spec``, or every error in it.

Takes: a ``Normalized`` document (``dsl/normalize.py``, ``dsl/jsonspec.py``, with
``dsl/overrides.py`` applied) and the SourceMap of its texts. Gives: ``Spec``
(``dsl/spec.py``), or raises ``Diagnostics`` holding all errors sorted by position:
those of normalization, then JSON Schema errors (``dsl/schema.py``) mapped back to
the span of the offending text, then the semantic checks of ``dsl/checks.py`` (run
on what the schema accepted). After: ``dsl/build_spec.py`` assembles the Spec.
"""

from __future__ import annotations

import json

from . import checks
from .build_spec import build_spec
from .diagnostics import Diagnostics, ParcError, SourceMap, Span, clip, did_you_mean
from . import units
from .keys import BLOCKS, UNIT_TYPES, Param, expected_words, list_element
from .normalize import Normalized, Origin, dotted
from .schema import validator
from .spec import Spec


def validate(norm: Normalized, sources: SourceMap, source: str, *, buildable: bool = True) -> Spec:
    """Check ``norm``; ``source`` is the file as the user named it (``Spec.source``);
    ``buildable``: also refuse what ``parc build`` cannot generate yet (``dsl/checks.py``)."""
    found = list(norm.errors)
    found += schema_errors(norm)
    bad = norm.bad | {path for path, _ in found}
    found += checks.run(norm, bad, buildable=buildable)
    if found:
        raise Diagnostics(_unique(error for _, error in found), sources)
    return build_spec(norm, source)


def _unique(errors) -> list[ParcError]:
    seen, out = set(), []
    for error in errors:
        key = (error.span, error.code, error.message)
        if key not in seen:
            seen.add(key)
            out.append(error)
    return out


def _under(path: tuple, prefixes) -> bool:
    return any(path[: len(p)] == p for p in prefixes)


def schema_errors(norm: Normalized) -> list[tuple[tuple, ParcError]]:
    out: list[tuple[tuple, ParcError]] = []
    for error in validator().iter_errors(norm.doc):
        out.extend(_map(error, norm))
    return out


def param_at(path: tuple, doc: dict) -> Param | None:
    """The key table's entry for the value at ``path``, if it has one: an item of a
    per-layer list is the key's single value (Note [per-layer values]), an item of
    another list its element (``list_element``), an argument of a call the call's."""
    if len(path) < 2 or path[0] not in BLOCKS:
        return None
    param = BLOCKS[path[0]].key(path[1])
    value = doc.get(path[0], {}).get(path[1]) if isinstance(doc.get(path[0]), dict) else None
    for part in path[2:]:
        if param is None:
            return None
        if isinstance(part, int):
            param = list_element(param)
            value = value[part] if isinstance(value, list) and part < len(value) else None
        elif param.type == "call":
            call = param.call(value.get("kind")) if isinstance(value, dict) else None
            param = call.param(part) if call is not None else None
            value = value.get(part) if isinstance(value, dict) else None
        else:
            return None
    return param


def _list_item(path: tuple, norm: Normalized) -> bool:
    """``path`` is an item of a list that stands for one value (a per-layer list,
    a schedule's ``slices = [16, 8, 8]``), not of a list-valued type such as ``betas``."""
    if len(path) < 3 or not isinstance(path[-1], int):
        return False
    param = param_at(path[:-1], norm.doc)
    return param is not None and (param.per_layer or param.or_list is not None)


def _origin(norm: Normalized, path: tuple) -> Origin:
    for end in range(len(path), 0, -1):
        origin = norm.origins.get(path[:end])
        if origin is not None:
            return origin
    return Origin(span=norm.start, text="")


def _number(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


_RANGE_WORDS = {
    "minimum": "at least",
    "exclusiveMinimum": "greater than",
    "maximum": "at most",
    "exclusiveMaximum": "less than",
}


def _map(error, norm: Normalized) -> list[tuple[tuple, ParcError]]:
    path = tuple(error.absolute_path)
    if _under(path, norm.bad):
        return []
    kind = error.validator
    if kind in ("anyOf", "oneOf"):
        return [pair for e in _branch_errors(error) for pair in _map(e, norm)]
    origin = _origin(norm, path)
    shown = origin.text if path in norm.origins and origin.text else json.dumps(error.instance)
    shown = clip(shown, 80)
    name = dotted(path)

    def report(code: str, message: str, hint: str | None = None, span: Span | None = None):
        return [(path, ParcError(span=span or origin.span, code=code, message=message, hint=hint))]

    if kind == "required":
        return _required(error, norm, path, origin)
    if kind == "additionalProperties":
        return _unknown_keys(error, norm, path)
    if len(path) == 0:
        return report("PAR0107", "a spec must be a JSON object of blocks", "see `parc schema`")
    if len(path) == 1:
        block = BLOCKS[path[0]]
        words = ' or "auto"' if block.may_be_auto else ""
        return report("PAR0107", f"the {block.name} block must be an object{words}, got {shown}")
    if path == ("model", "name"):
        return report(
            "PAR0114",
            f"the model name {shown} is not an identifier",
            "a name is letters, digits and `_`, not starting with a digit",
        )
    param = param_at(path, norm.doc)
    if path[-1] == "kind" and len(path) >= 3:
        call_param = param_at(path[:-1], norm.doc)
        choices = [c.name for c in call_param.calls] if call_param else []
        near = did_you_mean(str(error.instance), choices)
        return report(
            "PAR0108",
            f"unknown `{dotted(path[:-1])}` kind {shown}",
            f'did you mean "{near}"?' if near else "expected one of " + ", ".join(choices),
        )
    if param is None:  # pragma: no cover - every schema path has a table entry
        return report("PAR0107", f"`{name}` is not valid here ({shown})")
    if kind in _RANGE_WORDS:
        bound = _number(error.validator_value)
        if param.type in UNIT_TYPES and error.validator_value:
            bound = units.describe(param.type, error.validator_value)
        hint = None
        if _list_item(path, norm):
            key = param_at(path[:-1], norm.doc)
            hint = (f"the list gives each layer's `{key.name}`; each must be {_RANGE_WORDS[kind]} {bound}"
                    if key.per_layer else f"each entry of the list is {param.doc}, {_RANGE_WORDS[kind]} {bound}")
        return report(
            "PAR0109", f"`{name}` = {shown} is out of range: it must be {_RANGE_WORDS[kind]} {bound}",
            hint or (param.limit if kind == "maximum" else None),
        )
    if kind == "pattern" and param.type == "string":  # keys.NO_CONTROL
        char = next(c for c in error.instance if ord(c) < 0x20 or ord(c) == 0x7F)
        return report(
            "PAR0117",
            f"`{name}` = {shown} holds the control character U+{ord(char):04X}",
            "a path holds no control characters (tab, newline, ...): write the file's or folder's real name",
        )
    if kind == "minLength":
        return report("PAR0109", f"`{name}` is an empty string", "give a non-empty string: " + param.doc)
    if kind in ("minItems", "maxItems"):
        count = len(error.instance)
        if param.per_layer and count == 0:
            return report("PAR0116", f"`{name}` is an empty list",
                          "give one value per layer, or a single value for all of them")
        need = ("exactly 2 numbers" if param.type in ("pair", "int_pair") else
                f"at least {error.validator_value} values" if param.or_list is not None else "at least one stage")
        return report(
            "PAR0116", f"`{name}` needs {need}, got {count}", f"e.g. {expected_words(param)}"
        )
    if kind == "enum" and param.type == "enum":
        near = did_you_mean(str(error.instance), param.choices + (("auto",) if param.auto else ()))
        hint = f"did you mean `{near}`? " if near else ""
        return report(
            "PAR0108",
            f"unknown {param.name} `{shown}` for `{name}`",
            hint + "expected one of " + ", ".join(param.choices),
        )
    hint = None
    if param.type == "int" and isinstance(error.instance, float) and error.instance.is_integer():
        hint = f"write it as an integer: {_number(error.instance)}"
    if param.auto and isinstance(error.instance, str) and did_you_mean(error.instance, ["auto"]):
        hint = "did you mean `auto`?"
    return report("PAR0107", f"`{name}` expects {expected_words(param)}, got {shown}", hint)


def _branch_errors(error) -> list:
    """The errors of the alternatives the value was meant for. A value that may be
    ``auto``, one value or a list (``tp = [2, 0]``) fails every branch: those it fails
    only by its type or by not being ``"auto"`` were not meant, the branch of its own
    type speaks (``tp = 0``: out of range, not "expects an integer"). When every branch
    fails by type, the value is of no allowed type: any of them says so."""
    by_branch: dict = {}
    for inner in error.context:
        by_branch.setdefault(inner.relative_schema_path[0], []).append(inner)
    meant = [
        errors
        for errors in by_branch.values()
        if not all(_other_type(e) for e in errors)
    ]
    chosen = meant or [errors for branch, errors in by_branch.items() if branch != 0] or list(by_branch.values())
    return [e for errors in chosen for e in errors]


def _other_type(error) -> bool:
    """``error`` says only that the value is of another type than its branch takes (a
    list where a word of an enum belongs, anything where ``"auto"`` is the branch)."""
    if error.relative_path:
        return False
    if error.validator == "enum":
        return not isinstance(error.instance, str)
    return error.validator in ("type", "const")


def _required(error, norm: Normalized, path: tuple, origin: Origin):
    out = []
    for key in error.validator_value:
        if key in error.instance or _under(path + (key,), norm.bad):
            continue
        if len(path) == 0:
            block = BLOCKS[key]
            label = " NAME" if block.named else ""
            message, hint = f"missing `{key}` block", f"add `{key}{label} {{ ... }}`: {block.doc}"
            span = norm.start
        elif len(path) == 1:
            block = BLOCKS[path[0]]
            if key == "name":
                message, hint = (
                    f"the {block.name} block needs a name",
                    f"write `{block.name} NAME {{`",
                )
            else:
                param = block.key(key)
                message = f"the {block.name} block is missing `{key}`"
                hint = f"add `{key} = ...`: {param.doc}; {expected_words(param)}"
            span = origin.span
        else:
            param = param_at(path, norm.doc)
            call = param.call(error.instance.get("kind")) if param is not None else None
            if key == "kind" or call is None:
                kinds = [c.name for c in param.calls] if param is not None else []
                example = f'e.g. {{"kind": "{kinds[0]}"}}' if kinds else '{"kind": NAME}'
                message = f'`{dotted(path)}` needs "kind"'
                hint = example + (f"; kind is one of {', '.join(kinds)}" if kinds else "")
            else:
                message, hint = f"`{call.name}` needs `{key}`", f"`{call.signature()}`"
            span = origin.span
        out.append(
            (
                path + (key,),
                ParcError(
                    span=span,
                    code="PAR0103" if len(path) == 0 else "PAR0106",
                    message=message,
                    hint=hint,
                ),
            )
        )
    return out


def _unknown_keys(error, norm: Normalized, path: tuple):
    out = []
    known = list(error.schema.get("properties", {}))
    for key in error.instance:
        if key in known or _under(path + (key,), norm.bad):
            continue
        origin = _origin(norm, path + (key,))
        span = origin.key_span or origin.span
        near = did_you_mean(str(key), known)
        hint = f"did you mean `{near}`?" if near else "expected one of " + ", ".join(known)
        if len(path) == 0:
            code, message = "PAR0101", f"unknown block `{clip(str(key))}`"
        elif len(path) == 1:
            code, message = "PAR0104", f"unknown key `{clip(str(key))}` in the {path[0]} block"
        else:
            kind = clip(str(error.instance.get("kind")))
            code, message = "PAR0113", f"`{kind}` has no argument `{clip(str(key))}`"
        out.append((path + (key,), ParcError(span=span, code=code, message=message, hint=hint)))
    return out
