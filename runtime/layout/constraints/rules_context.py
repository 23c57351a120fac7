"""Context parallelism: cp and its kinds."""

from __future__ import annotations

import math

from ..rule_engine import _violation, divisors, rule, some
from ..rule_keys import declare
from .rules_mesh import _and

declare(cp_kind="parallel.cp_kind")  # Note [a feature declares its values]



def _cp_parts(cp, tp, ring, both) -> int:
    """What seq_len must divide by: cp chunks (2·cp for ring), each split over tp under sp."""
    return math.lcm(2 * cp if ring else cp, cp * tp if both else 1)



@rule("PAR0220")
def cp_divides_seq_len(cp, seq_len, sp=None, tp=None, cp_kind=None):
    """Each cp rank holds seq_len / cp tokens (ring: two chunks of seq_len / (2·cp), the
    causal load balance of ``data.context_spans``); under sp its tp ranks split them again."""
    if cp == 1:
        return None
    both, ring = sp is True and tp is not None and tp > 1, cp_kind == "ring"
    parts = _cp_parts(cp, tp, ring, both)
    if seq_len % parts == 0:
        return None
    formulas = ([f"2·cp = {2 * cp}"] if ring else []) + ([f"cp·tp = {cp}·{tp} = {cp * tp}"] if both else [])
    whys = (["cp_kind = ring splits each sequence into 2·cp chunks, two a rank"] if ring else []) + (
        ["sp = true splits each cp rank's tokens over tp"] if both else [])
    formula = " and ".join(formulas) or f"cp = {cp}"
    why = f" ({'; '.join(whys)})" if whys else ""
    fits = [d for d in divisors(seq_len) if seq_len % _cp_parts(d, tp, ring, both) == 0]
    return _violation("PAR0220", ("parallel.cp", "model.seq_len"),
                      f"seq_len = {seq_len} is not divisible by {formula}{why}",
                      f"make seq_len a multiple of {parts}, or cp one of {some(fits, cp)}")



@rule("PAR0221")
def ulysses_heads(cp, cp_kind, heads, tp, kv_heads=None):
    """Ulysses trades the sequence shard for a head shard: every rank takes heads / (cp·tp)."""
    if cp == 1 or cp_kind != "ulysses":
        return None
    parts = cp * tp
    failing = [(n, v) for n, v in (("heads", heads), ("kv_heads", kv_heads)) if v is not None and v % parts]
    if not failing:
        return None
    words = _and([f"{n} = {v}" for n, v in failing])
    common = math.gcd(heads, kv_heads) if kv_heads is not None else heads
    fits = [d for d in divisors(common) if d % tp == 0 and d // tp > 1]
    hint = "use cp_kind = allgather (it needs no head split)"
    if fits:
        hint = f"cp must be one of {some([d // tp for d in fits], cp)} with tp = {tp}, or {hint}"
    return _violation("PAR0221", ("parallel.cp_kind", "parallel.cp"),
                      f"cp_kind = ulysses needs heads and kv_heads divisible by cp·tp = {cp}·{tp} = {parts}, "
                      f"but {words} {'is' if len(failing) == 1 else 'are'} not", hint)
