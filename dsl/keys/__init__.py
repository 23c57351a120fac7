"""Every block, key and call of the language, as one table (a package: a module per block).

Takes: the schedule table (``runtime/schedules/schedule.py``: the ``schedule`` key's calls
are its kinds' words). Gives: ``BLOCKS`` (block name → ``BlockDef``), each
key's ``Param`` (type, range, default, whether it may be ``auto``, its calls) and
``expected_words`` for messages. ``dsl/schema.py`` generates the JSON Schema from
this table, ``dsl/normalize.py`` uses it to resolve units and calls, and
docs/language.md describes the same keys (a test keeps them in step).
"""

from __future__ import annotations

from dataclasses import replace

from .. import units

from .mesh import MESH
from .model import MODEL, MOE_KEYS
from .parallel import PARALLEL
from .train import TRAIN
from .types import (  # noqa: F401 - the table's API
    DEVICES, INT_MAX, LAYERS_MAX, NO_CONTROL, NUMBER_MAX, UNIT_TYPES, BlockDef, CallDef, Param, _int,
)

__all__ = ["BLOCKS", "DEVICES", "ELEMENT", "INT_MAX", "LAYERS_MAX", "MOE_KEYS", "NO_CONTROL", "NUMBER_MAX",
           "UNIT_TYPES", "BlockDef", "CallDef", "Param", "expected_words", "list_element"]

BLOCKS: dict[str, BlockDef] = {b.name: b for b in (MODEL, MESH, PARALLEL, TRAIN)}

ELEMENT = {
    "int_list": _int("stage_layers", "layers of a stage"),
    "pair": Param(name="beta", type="number", doc="an Adam beta", minimum=0, exclusive_maximum=1),
    "int_pair": _int("side", "ranks along one side of the tensor-parallel mesh"),
}
"""The element of a list-valued type."""


def list_element(param: Param) -> Param | None:
    """What each item of a list written for ``param`` is: for a per-layer key, the key's
    own single value (``recompute = [full, none]``; Note [per-layer values] in
    ``dsl/normalize.py``), else its ``or_list`` element or ``ELEMENT`` of its type."""
    if param.per_layer:
        return replace(param, per_layer=False, auto=False)
    return param.or_list or ELEMENT.get(param.type)


def expected_words(param: Param) -> str:
    """What ``param`` takes, for messages: "an integer or auto"."""
    if param.type in UNIT_TYPES:
        words = f"{units.KIND_WORDS[param.type]} such as {units.KIND_EXAMPLES[param.type]}"
    elif param.type == "enum":
        words = "one of " + ", ".join(param.choices)
    elif param.type == "call":
        words = "one of " + ", ".join(call.signature() for call in param.calls)
    else:
        words = {
            "int": "an integer",
            "number": "a number",
            "bool": "true, false" if param.auto else "true or false",
            "string": "a string",
            "int_list": "a list of integers such as [4, 4]",
            "pair": "a pair of numbers such as (0.9, 0.95)",
            "int_pair": "a pair of integers such as (2, 2)",
        }[param.type]
    if param.or_none:
        words += " or none"
    if param.per_layer:
        words += ", or a list of those with one per layer"
    if param.or_list is not None:
        words += ", or a list of integers such as [16, 8, 8]"
    return words + " or auto" if param.auto else words
