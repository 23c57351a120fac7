"""Semantic checks: what the schema cannot say about a spec.

Takes: the normalized document (``dsl/normalize.py``) and the paths already found
bad. Gives: a list of (path, ParcError), each message the formula with its values
filled in ("world size: dp·cp·tp·pp = 2·1·3·1 = 6 ..."). The rules themselves are those
of ``runtime/layout/constraints/``, which ``parc build`` and the search call too; this
module hands them the document's plain values and places each violation at the spec
text it blames. A value that is ``auto``, missing or invalid is unknown to the rules,
so a rule that needs it is skipped and one mistake gives one error. Defaults are
those of ``dsl/spec.py`` (kv_heads = heads, pad_vocab_to = 128, ...). With
``buildable`` (``parc check``, ``parc build``) the rules of what ``parc build`` cannot
generate yet apply to written values too (PAR0802); ``parc plan`` leaves them out, as it
predicts such layouts.

Before: the schema (``dsl/validate.py``). After: ``dsl/build_spec.py``.
"""

from __future__ import annotations

from parc.runtime.layout import constraints, layouts
from parc.runtime.layout.layer_settings import SETTINGS, read_value

from . import parallel_fields
from .diagnostics import ParcError, Span
from .keys import MOE_KEYS
from .normalize import Normalized

_DEFAULTS = {  # the parallel block's come from its table: parallel_fields.default_value
    ("model", "pad_vocab_to"): 128,
    ("model", "experts"): 0,
    ("model", "top_k"): 2,
    ("model", "documents"): "joined",
    ("model", "qk_norm"): False,
    ("model", "attention_bias"): False,
}
class _Values:
    def __init__(self, norm: Normalized, bad: set):
        self.norm, self.bad = norm, bad

    def get(self, block: str, key: str):
        """The value, its default, or None (auto, missing, or invalid)."""
        path = (block, key)
        if any(path[: len(p)] == p or p[: len(path)] == path for p in self.bad):
            return None
        values = self.norm.doc.get(block)
        if not isinstance(values, dict):
            return None
        if block == "parallel":
            default = parallel_fields.default_value(key)  # what build_spec reads, unwritten
        else:
            default = _DEFAULTS.get(path)
        value = values.get(key, default)
        return None if value == "auto" else value

    def span(self, *paths: tuple) -> Span:
        """Where the first written of ``paths`` is (else its block, else the file)."""
        for path in paths:
            origin = self.norm.origins.get(path)
            if origin is not None:
                return origin.span
        for path in paths:
            origin = self.norm.origins.get(path[:1])
            if origin is not None:
                return origin.span
        return self.norm.start

    def written(self, block: str, key: str) -> bool:
        return (block, key) in self.norm.origins

    def set_index(self, path: tuple) -> int | None:
        """N when the value at ``path`` came from the N-th ``--set``, else None."""
        origin = self.norm.origins.get(path)
        if origin is None or not origin.span.file.startswith("--set"):
            return None
        return int(origin.span.file.split()[-1])


def plain_values(v: _Values) -> dict:
    """The document's values by the names of ``constraints.KEYS`` (None: unknown)."""
    out = {name: v.get(*key.split(".")) for name, key in constraints.KEYS.items() if key.count(".") == 1}
    out.pop("padded_vocab")  # the rules compute it from vocab and pad_vocab_to
    out["moe_written"] = tuple(key.name for key in MOE_KEYS[1:] if v.written("model", key.name))
    constraints.layer_degrees(out)  # per-layer tp/dp lists → the coarse split and the lists
    for entry in SETTINGS:  # Note [per-layer values]: a list holds one entry per block
        plain = None if out[entry.name] is None else read_value(entry.name, out[entry.name])
        out[entry.name] = None if plain is None or None in constraints.entries(plain) else plain
    lr_schedule = v.get("train", "schedule")
    out["warmup"] = lr_schedule.get("warmup") if isinstance(lr_schedule, dict) else None
    out["decay"] = lr_schedule.get("decay") if isinstance(lr_schedule, dict) else None
    data = out.pop("data")
    out["data"] = data.get("kind") if isinstance(data, dict) else None
    out["data_dtype"] = data.get("dtype") if isinstance(data, dict) else None
    for name, key in (("data_files", "path"), ("data_weights", "weights"), ("data_val_files", "val")):
        value = data.get(key) if isinstance(data, dict) else None
        out[name] = None if value is None else len(value) if isinstance(value, list) else 1
    parallel = v.norm.doc.get("parallel") if isinstance(v.norm.doc, dict) else None
    fields = parallel_fields.checked_values(parallel, lambda key: v.get("parallel", key))
    out |= {name: value for name, value in fields.items() if name in constraints.KEYS}  # Note [a key is its field]
    optimizer = out.pop("optimizer")
    out["optimizer"] = optimizer.get("kind") if isinstance(optimizer, dict) else optimizer
    return out


def _blamed(v: _Values, violation: constraints.Violation) -> Span:
    paths = [tuple(key.split(".")) for key in violation.blame]
    if violation.blame_latest_set:
        given = [(v.set_index(p), p) for p in paths if v.set_index(p) is not None]
        if given:
            return v.span(max(given)[1])
    return v.span(*paths)


def run(norm: Normalized, bad: set, *, buildable: bool = True) -> list[tuple[tuple, ParcError]]:
    values = _Values(norm, bad)
    kinds = (constraints.LAYOUT, constraints.BUILD) if buildable else (constraints.LAYOUT,)
    found = []
    plain = plain_values(values)
    broken = constraints.violations(plain, kinds)
    if not broken and not bad:  # every None left is an ``auto``: can the planner fill them?
        broken = [v for v in (layouts.no_layout(plain),) if v is not None]
    for violation in broken:
        error = ParcError(
            span=_blamed(values, violation), code=violation.code, message=violation.message, hint=violation.hint
        )
        found.append((tuple(violation.blame[0].split(".")), error))
    return found

