"""Units of the language and their SI factors.

Takes: nothing (leaf module). Gives: ``UNITS`` (unit text → (kind, factor to SI)),
the four kinds (``size`` in bytes, ``bandwidth`` in bytes/s, ``flops`` in FLOP/s,
``time`` in seconds), and ``suggest_unit`` for "did you mean" hints. Used by
``dsl/parse.py`` (is this word a unit?) and ``dsl/normalize.py`` (resolve it, and
refuse a unit of the wrong kind: a size where a bandwidth belongs).

Units are case-sensitive: ``GB/s`` is gigabytes per second, ``Gb/s`` gigabits
(1e9 / 8 bytes per second). Decimal prefixes are powers of 1000, binary ones
(``KiB``, ``MiB``, ...) powers of 1024.
"""

from __future__ import annotations

from .diagnostics import did_you_mean

SIZE = "size"
BANDWIDTH = "bandwidth"
FLOPS = "flops"
TIME = "time"

KIND_WORDS = {
    SIZE: "a size",
    BANDWIDTH: "a bandwidth",
    FLOPS: "a FLOP rate",
    TIME: "a time",
}
"""How messages name a kind: "a size where a bandwidth belongs"."""

KIND_EXAMPLES = {
    SIZE: "80 GiB",
    BANDWIDTH: "300 GB/s",
    FLOPS: "312 TFLOPS",
    TIME: "5 us",
}

LARGEST = {
    SIZE: 1e18,
    BANDWIDTH: 1e15,
    FLOPS: 1e21,
    TIME: 3600.0,
}
"""The largest value of each kind a spec may give, in SI units: an exabyte of memory,
1000 TB/s, 1e21 FLOP/s (a thousand times today's largest chips' figures, or more)
and an hour of latency. A value past them is a typo (``1e300 TB/s``), and it must
not reach the planner's arithmetic, where it would become infinity."""


def describe(kind: str, value: float) -> str:
    """``value`` (SI) in the largest decimal unit of ``kind`` it is at least 1 of:
    ``describe(BANDWIDTH, 1e15) == "1000 TB/s"``, for messages."""
    best = min((factor, unit) for unit, (k, factor) in UNITS.items() if k == kind)
    for unit, (k, factor) in UNITS.items():
        if k == kind and "i" not in unit and "b/" not in unit and "FLOP/" not in unit:
            if best[0] <= factor <= abs(value):
                best = (factor, unit)
    scaled = value / best[0]
    shown = str(int(scaled)) if scaled.is_integer() and abs(scaled) < 1e15 else f"{scaled:g}"
    return f"{shown} {best[1]}"


_DECIMAL = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}


def _table() -> dict[str, tuple[str, float]]:
    units: dict[str, tuple[str, float]] = {}
    for prefix, factor in {**_DECIMAL, **_BINARY}.items():
        units[f"{prefix}B"] = (SIZE, factor)
        units[f"{prefix}B/s"] = (BANDWIDTH, factor)
    for prefix, factor in _DECIMAL.items():
        units[f"{prefix}b/s"] = (BANDWIDTH, factor / 8)
    for prefix, factor in {"": 1.0, "G": 1e9, "T": 1e12, "P": 1e15}.items():
        units[f"{prefix}FLOPS"] = (FLOPS, factor)
        units[f"{prefix}FLOP/s"] = (FLOPS, factor)
    for unit, factor in {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}.items():
        units[unit] = (TIME, factor)
    return units


UNITS: dict[str, tuple[str, float]] = _table()


def units_of(kind: str) -> tuple[str, ...]:
    return tuple(unit for unit, (k, _) in UNITS.items() if k == kind)


def suggest_unit(unit: str) -> str | None:
    """A hint for an unknown unit: the same letters in another case, or a near one."""
    same_letters = sorted(u for u in UNITS if u.lower() == unit.lower())
    if len(same_letters) == 1:
        return f"did you mean {same_letters[0]}? (units are case-sensitive)"
    if same_letters:
        return "units are case-sensitive: " + " or ".join(
            f"{u} ({'bits' if 'b/' in u else 'bytes'})" for u in same_letters
        )
    near = did_you_mean(unit, UNITS)
    if near:
        return f"did you mean {near}?"
    return "units: B KB MB GB TB KiB MiB GiB TiB, B/s ... GB/s, Gb/s, FLOPS ... PFLOPS, s ms us ns"
