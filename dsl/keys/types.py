"""The language's key table's types: ``Param`` (a key), ``CallDef`` (a call a key takes),
``BlockDef`` (a block), and the bounds every key shares. Leaf module of ``dsl/keys/``."""

from __future__ import annotations

from dataclasses import dataclass

from .. import units

INT_MAX = 2**31 - 1
"""Largest integer any key accepts (keeps later stages' arithmetic sane)."""
LAYERS_MAX = 10_000
"""Most transformer blocks a model may have: parc describes, plans and renders each block
on its own (per-layer settings, the planner's per-layer costs), so its work and memory grow
with the count; 2³¹ − 1 blocks would take gigabytes before anything else is checked. Deep
models have a few hundred blocks."""
NUMBER_MAX = 1e12
"""Largest plain number a key accepts where it names no tighter bound (``lr``,
``rope_theta``, ``grad_clip``, ...): every number is finite and of a sane size
before it leaves the front end. Unit kinds have theirs in ``units.LARGEST``."""

NO_CONTROL = "^[^\x00-\x1f\x7f]*$"
"""Every string of a spec is a path (a token file, a folder, a profile): no control
characters, which no file name of a portable program holds (a tab or a newline written
as an escape in the spec would reach the file system otherwise). PAR0117."""
UNIT_TYPES = (units.SIZE, units.BANDWIDTH, units.FLOPS, units.TIME)
DEVICES = ("a100-40gb", "a100-80gb", "h100-80gb", "h200", "rtx3090", "cpu")


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    """A key of a block or an argument of a call."""

    name: str
    type: str
    """int | number | bool | string | enum | int_list | pair | int_pair | call, or a unit kind
    (size | bandwidth | flops | time: written with a unit, stored in SI units)."""
    doc: str
    default: str | None = None
    """The default as docs show it; None when required or derived."""
    required: bool = False
    minimum: float | None = None
    exclusive_minimum: float | None = None
    maximum: float | None = None
    exclusive_maximum: float | None = None
    choices: tuple[str, ...] = ()
    auto: bool = False
    """``auto`` is allowed (left to the planner)."""
    whole_auto: bool = True
    """``parallel = auto`` makes it ``auto`` too (``cp`` stays 1 unless written ``auto``)."""
    calls: tuple["CallDef", ...] = ()
    per_layer: bool = False
    """Also takes a list with one value per transformer block (``[full, none, ...]``)."""
    or_none: bool = False
    """The word ``none`` is also allowed (``capacity_factor = none``: no limit)."""
    limit: str | None = None
    """Why ``maximum`` is what it is, where it is tighter than the type's (the hint of PAR0109)."""
    or_list: "Param | None" = None
    """Also takes a list of two or more of these elements (a schedule's ``slices = [16, 8, 8]``:
    the slices' token lengths instead of their count)."""
    field: str | None = None
    """The record field (``ParallelSpec``, dsl/spec.py) that holds a call argument, where it is
    not the argument's own name (two calls' ``rank`` are two fields); Note [a key is its field]
    in ``dsl/parallel_fields.py``."""
    lengths_field: str | None = None
    """With ``or_list``: the field that holds the list as written (``field`` then holds its length)."""
    auto_field: str | None = None
    """The bool field that records a written ``auto``, for a key whose None field means its
    default rather than ``auto``."""
    lossy: bool = False
    """Other than its default, it changes what a step computes by design (compression):
    ``parc verify`` turns it off (``codegen/shrink.py``)."""
    qualifies: str | None = None
    """The key this one only qualifies (its stages, its ranks): taken out with it."""
    one_rank: str | None = None
    """What a one-rank program writes for it, where its default is a rule over the layout
    rather than a value (``parc verify``'s reference, ``codegen/shrink.py``)."""

    def __post_init__(self) -> None:
        # Every number has an upper bound (NUMBER_MAX, units.LARGEST) unless given one.
        if self.maximum is None and self.exclusive_maximum is None:
            largest = units.LARGEST.get(self.type, NUMBER_MAX if self.type == "number" else None)
            object.__setattr__(self, "maximum", largest)

    def call(self, name: str) -> "CallDef | None":
        for call in self.calls:
            if call.name == name:
                return call
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallDef:
    """One function a call-valued key accepts: ``interleaved(chunks = 2)``."""

    name: str
    params: tuple[Param, ...] = ()
    doc: str = ""

    def param(self, name: str) -> Param | None:
        for param in self.params:
            if param.name == name:
                return param
        return None

    def signature(self) -> str:
        if not self.params:
            return self.name
        inner = ", ".join(p.name if p.required else f"{p.name} = {p.default}" for p in self.params)
        return f"{self.name}({inner})"


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockDef:
    name: str
    doc: str
    keys: tuple[Param, ...]
    named: bool = False
    """``model NAME { ... }`` takes a name; the other blocks do not."""
    may_be_auto: bool = False
    """``parallel = auto``."""

    def key(self, name: str) -> Param | None:
        for key in self.keys:
            if key.name == name:
                return key
        return None


def _int(name, doc, *, minimum=1, **kw) -> Param:
    return Param(
        name=name, type="int", doc=doc, minimum=minimum, maximum=kw.pop("maximum", INT_MAX), **kw
    )
