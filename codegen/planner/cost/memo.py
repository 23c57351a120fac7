"""Per-search memo tables: a part of a layout's cost computed once for the layouts that
agree on everything that part reads.

Takes: an owner (the spec, and the hardware and accounting where the part reads them),
a table name, a key (the layout fields the part reads) and the function computing the
part. Gives: ``shared(...)``, the memoized value. Before: nothing. After:
``cost/memory.py``, ``cost/time.py``, ``cost/estimate.py``.

Note [planner caches]: a search scores thousands of layouts of one spec, and most parts
of a layout's cost read only a few of its fields: a rank's parameters, gradients and
optimizer state do not read the micro-batch or the recompute mode, its activations not
the ZeRO stage, a block's compute not dp. Each such part is computed once per distinct
value of the fields it reads (its key) and reused by every layout that shares them,
exactly as computed (the same floating-point operations on the same inputs: a layout's
figures are bit-identical with or without the tables; tests/planner/test_bounded.py
compares layouts' estimates with the tables cleared before each). A table
belongs to one owner — the objects its parts read besides the layout, compared by
identity and held so their ``id`` is not reused — and starts empty when another owner
asks. The key must hold every field the part reads: a field left out would hand one
layout another's figures, which is why each table's key is every ``Layout`` field but
those its part does not read (``layout.fields_but``, written beside the function it
caches): a field added to ``Layout`` joins every key until a part is shown not to read it.
"""

from __future__ import annotations

_TABLES: dict[str, tuple[tuple, dict]] = {}
"""Table name → (its owner, key → value)."""


def shared(owner: tuple, table: str, key: tuple, compute):
    """``compute()``, once per ``key`` of ``table`` while ``owner`` (compared by identity) holds it."""
    held = _TABLES.get(table)
    if held is None or len(held[0]) != len(owner) or any(a is not b for a, b in zip(held[0], owner)):
        held = _TABLES[table] = (owner, {})
    values = held[1]
    value = values.get(key, _MISSING)
    if value is _MISSING:
        value = values[key] = compute()
    return value


def clear() -> None:
    """Forget every table (tests: each layout scored from nothing)."""
    _TABLES.clear()


_MISSING = object()
