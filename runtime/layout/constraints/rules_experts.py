"""Mixture of experts: ep, etp and the MoE keys (runtime/parallel/expert/moe.py)."""

from __future__ import annotations



from typing import Iterator, Mapping

from ..rule_engine import _violation, divisors, rule, some
from ..rule_keys import declare, derive

declare(etp="parallel.etp")  # Note [a feature declares its values]


@derive(written="ep·etp")  # Note [a derived value]: ZeRO's rules read it
def expert_fold(ep=None, etp=None) -> int:
    """ep·etp: the ways parallel folding splits a stage's ranks for the experts (Note [parallel
    folding] in expert_folding.py), the rest being edp = dp·cp·tp / (ep·etp); 1 without them."""
    return (ep or 1) * (etp or 1)

EXPERT_DEGREES = ("ep", "etp")
"""The expert layers' degrees: the values ``expert_folds`` proposes to the layout search."""


def expert_folds(values: Mapping) -> Iterator[dict]:
    """The expert degrees the layout search tries once dp and tp are known (Note [the search
    space] in layouts.py), the spec's where given (missing: 1): ep among the divisors of the
    experts, etp among those of tp (within a tp group, one node, as Megatron-Core keeps it);
    1 without experts. A superset of what the rules allow (the search asks them)."""

    def allowed(name: str, options: list) -> list:  # the spec's value, else every option
        given = values.get(name, 1)
        return [given] if given is not None else options

    experts = values.get("experts") or 0
    for ep in allowed("ep", divisors(experts) if experts else [1]):
        for etp in allowed("etp", divisors(values["tp"]) if experts else [1]):
            yield {"ep": ep, "etp": etp}



@rule("PAR0234")
def moe_keys_need_experts(experts, moe_written):
    """A mixture-of-experts key (``top_k``, ``capacity_factor``, ...) written for a dense
    model does nothing: as ``ep`` on a dense model (PAR0231), it is refused."""
    if experts > 0:
        return ()
    return tuple(
        _violation("PAR0234", (f"model.{key}", "model.experts"),
                   f"{key} is a mixture-of-experts setting, but the model is dense (experts = 0): it does nothing",
                   f"remove {key}, or give the model routed experts (experts = N)")
        for key in moe_written
    )



@rule("PAR0231")
def ep_divides_experts(ep, experts):
    """Each expert-parallel rank holds experts / ep whole experts."""
    if ep == 1 or (experts > 0 and experts % ep == 0):
        return None
    if experts == 0:
        return _violation("PAR0231", ("parallel.ep", "model.experts"),
                          f"ep = {ep} splits the experts, but the model is dense (experts = 0)",
                          "set model.experts to a multiple of ep, or ep = 1")
    return _violation("PAR0231", ("parallel.ep", "model.experts"),
                      f"ep = {ep} does not divide experts = {experts}",
                      f"ep must be one of {some(divisors(experts), ep)}")



@rule("PAR0232")
def experts_fold_ranks(ep, etp, dp, tp, cp=None):
    """Parallel folding: expert layers re-read a stage's dp·cp·tp ranks as edp·ep·etp."""
    ranks = dp * (cp or 1) * tp
    if ranks % (ep * etp) == 0:
        return None
    return _violation("PAR0232", ("parallel.ep", "parallel.etp"),
                      f"expert layers fold dp·cp·tp = {dp}·{cp or 1}·{tp} = {ranks} ranks as edp·ep·etp, "
                      f"but ep·etp = {ep}·{etp} = {ep * etp} does not divide {ranks}",
                      f"ep·etp must be one of {some(divisors(ranks), ep * etp)}")



@rule("PAR0233")
def etp_divides_expert_ffn(etp, ffn, expert_ffn=None):
    size = ffn if expert_ffn is None else expert_ffn
    if size % etp == 0:
        return None
    return _violation("PAR0233", ("parallel.etp", "model.expert_ffn"),
                      f"etp = {etp} does not divide expert_ffn = {size}",
                      f"etp must be one of {some(divisors(size), etp)}")
