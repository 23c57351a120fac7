"""The parallel block's keys as ``ParallelSpec`` fields, by a loop over the key table.

Takes: the table (``dsl/keys/parallel.py``) and the record (``dsl/spec.py``). Gives:
``read`` (a document's values → fields, for ``build_spec``), ``document`` (fields → the
document, for ``spec_document``), ``rule_values`` (fields → the values of the rules,
``constraints.KEYS``, for ``codegen/spec_values.py``), ``checked_values`` (a document's
values → the same, for ``dsl/checks.py``) and ``default_value`` (what an unwritten key
reads as). No key is named here: a new key of the block needs an entry in the table and a
field in the record, nothing in this module.

Note [a key is its field]: a key of the parallel block sets the ``ParallelSpec`` field of
its name. A call's kind sets that field and each argument the field ``Param.field`` names
(else the argument's own name); an argument that also takes a list (``or_list``) holds
its length, the list itself in ``Param.lengths_field``; a key whose field is None for its
default, not for ``auto``, records a written ``auto`` in ``Param.auto_field``. An unwritten
key or argument reads as the field's default in ``ParallelSpec`` (the table's ``default``
is that value as the docs show it). ``dp`` and ``tp`` (per-layer degrees:
``constraints.layer_degrees``) and the per-layer settings (``layer_settings.SETTINGS``)
have readers of their own and are not in ``KEYS``.
"""

from __future__ import annotations

import dataclasses
import enum

from parc.runtime.layout.layer_settings import SETTINGS

from .keys import PARALLEL, Param
from .spec import ParallelSpec

DEFAULTS = {f.name: f.default for f in dataclasses.fields(ParallelSpec) if f.default is not dataclasses.MISSING}
"""Each field's value when its key is not written."""

KEYS: tuple[Param, ...] = tuple(
    param for param in PARALLEL.keys if param.name not in ("dp", "tp") and param.name not in {s.name for s in SETTINGS}
)
"""The keys whose fields this module reads and writes, in the table's order."""

_ABSENT = object()


def _plain(value):
    return value.value if isinstance(value, enum.Enum) else value


def _arguments(param: Param) -> dict[str, Param]:
    """Each argument of ``param``'s calls by the field that holds it."""
    return {arg.field or arg.name: arg for call in param.calls for arg in call.params}


ARGUMENTS = {field: (param, arg) for param in KEYS for field, arg in _arguments(param).items()}
"""Each call argument's field (and its list's field): the call key and the argument."""
ARGUMENTS |= {arg.lengths_field: (param, arg) for param, arg in list(ARGUMENTS.values()) if arg.lengths_field}


def _typed(field: str, value):
    """A document value as the field holds it: lists as tuples, enums and floats as the default's type."""
    default = DEFAULTS.get(field)
    if isinstance(value, list):
        return tuple(value)
    if isinstance(default, enum.Enum):
        return type(default)(value)
    return float(value) if type(default) is float else value


def _argument(arg: Param, value) -> dict:
    """The fields of one call argument (``_ABSENT``: not written, its default)."""
    field = arg.field or arg.name
    out = {field: DEFAULTS[field] if value is _ABSENT else _typed(field, value)}
    if arg.lengths_field:
        listed = isinstance(value, list)
        out |= {field: len(value) if listed else out[field], arg.lengths_field: tuple(value) if listed else None}
    return out


def read(parallel: dict, whole_auto: bool) -> dict:
    """The fields of ``KEYS`` from the parallel block's document values; ``whole_auto``:
    ``parallel = auto``, which makes a key ``auto`` where the table says so (``whole_auto``)."""
    fields = {}
    for param in KEYS:
        if whole_auto:
            value = "auto" if param.auto and param.whole_auto else _ABSENT
        else:
            value = parallel.get(param.name, _ABSENT)
        if param.auto_field:
            fields[param.auto_field] = value == "auto"
        if param.calls:  # the kind in the key's field, each argument in its own
            call = value if isinstance(value, dict) else {}
            for arg in _arguments(param).values():
                fields |= _argument(arg, call.get(arg.name, _ABSENT))
            value = call.get("kind", value)
        if value is _ABSENT:
            fields[param.name] = DEFAULTS.get(param.name)
        else:
            fields[param.name] = None if value == "auto" else _typed(param.name, value)
    return fields


def default_value(name: str):
    """What the unwritten key ``name`` reads as, as a document holds it (a call as
    ``{"kind": ...}``); None where the key has no value of its own (required, or a default
    that is a rule such as an even split)."""
    param = PARALLEL.key(name)
    entry = next((s for s in SETTINGS if s.name == name), None)
    default = DEFAULTS.get(name)
    if param is None or default is None:
        return None
    if entry is not None:
        return entry.write(_plain(default))
    return {"kind": _plain(default)} if param.calls else default


def document(par: ParallelSpec) -> dict:
    """The keys of ``KEYS`` as a document writes them: those the planner fills under
    ``parallel = auto`` and that have a value of their own always (``auto`` when None), the
    others only where they differ from their default."""
    doc = {}
    for param in KEYS:
        value, default = getattr(par, param.name), DEFAULTS.get(param.name)
        if param.auto_field and getattr(par, param.auto_field):
            doc[param.name] = "auto"
        elif value != default or param.required or (param.auto and param.whole_auto and default is not None):
            doc[param.name] = "auto" if value is None else _written(par, param, value)
    return doc


def _written(par: ParallelSpec, param: Param, value):
    if isinstance(value, tuple):
        return list(value)
    if not param.calls:
        return _plain(value)
    kind = _plain(value)
    out = {"kind": kind}
    for arg in param.call(kind).params:
        field = arg.field or arg.name
        listed = getattr(par, arg.lengths_field) if arg.lengths_field else None
        out[arg.name] = list(listed) if listed else getattr(par, field)
    return out


def rule_values(par: ParallelSpec, names) -> dict:
    """The fields ``names`` as the rules read them: plain values (an enum as its word, a
    per-layer setting as ``ParallelSpec.setting``); a call argument's field None while the
    call is ``auto``, its default where the chosen call does not take it."""
    out = {}
    for name in names:
        if name in ARGUMENTS:
            param, arg = ARGUMENTS[name]
            kind = par.setting(param.name)
            takes = kind is not None and param.call(kind).param(arg.name) is not None
            out[name] = None if kind is None else par.setting(name) if takes else DEFAULTS[name]
        else:
            out[name] = par.setting(name)
    return out


def checked_values(parallel, get) -> dict:
    """What ``rule_values`` gives, from the document ``dsl/checks.py`` checks: ``get(key)``
    the key's value (None: auto, missing or invalid), ``parallel`` the block as written. A
    call as its kind and the arguments of it the rules read; a pair as a tuple; a written
    ``auto`` in ``auto_field``."""
    out = {}
    for param in KEYS:
        value = get(param.name)
        if param.auto_field:
            out[param.auto_field] = isinstance(parallel, dict) and parallel.get(param.name) == "auto"
        if param.type == "int_pair":
            value = tuple(value) if isinstance(value, (list, tuple)) else None
        if param.calls:
            call = value if isinstance(value, dict) else None
            for field, arg in _arguments(param).items():
                fields = _argument(arg, call.get(arg.name, _ABSENT)) if call is not None else {}
                out |= {f: fields.get(f) for f in (field, arg.lengths_field) if f}
            value = None if call is None else call.get("kind")
        out[param.name] = value
    return out
