"""The batch: global, micro and the schedule's micro-batches."""

from __future__ import annotations



from ..rule_engine import _violation, divisors, rule, some



@rule("PAR0208")
def batch_divides(global_batch, micro_batch, dp=None, pp=None, schedule=None):
    if dp is None:
        if global_batch % micro_batch:
            return _violation("PAR0208", ("train.global_batch", "train.micro_batch"),
                              f"global_batch = {global_batch} is not divisible by micro_batch = {micro_batch}",
                              "global_batch = micro_batch · grad_accum · dp")
        return None
    per_step = micro_batch * dp
    if global_batch % per_step:
        below = global_batch // per_step * per_step
        near = " or ".join(str(n) for n in (below, below + per_step) if n > 0)
        fits = divisors(global_batch // dp) if global_batch % dp == 0 else []
        # shown at the key a --set changed last (--set train.micro_batch=3: there), else at global_batch
        return _violation("PAR0208", ("train.global_batch", "train.micro_batch", "parallel.dp"),
                          f"global_batch = {global_batch} is not divisible by micro_batch·dp = "
                          f"{micro_batch}·{dp} = {per_step}",
                          f"global_batch = micro_batch · grad_accum · dp: try global_batch = {near}"
                          + (f", or micro_batch = {some(fits, micro_batch)}" if fits else ""),
                          blame_latest_set=True)
    grad_accum = global_batch // per_step
    if pp is None or pp < 2:
        return None
    formula = f"global_batch / (micro_batch·dp) = {global_batch} / ({micro_batch}·{dp}) = {grad_accum}"
    if grad_accum < pp:
        return _violation("PAR0207", ("parallel.pp", "train.global_batch"),
                          f"micro-batches per step = {formula} is fewer than pp = {pp} stages",
                          f"a pipeline needs at least {pp} micro-batches: raise global_batch to "
                          f"{pp * per_step} or lower micro_batch")
    if schedule == "interleaved" and grad_accum % pp:
        return _violation("PAR0212", "parallel.schedule",
                          f"interleaved needs micro-batches per step divisible by pp: {formula} is not a "
                          f"multiple of pp = {pp}",
                          f"make global_batch a multiple of micro_batch·dp·pp = {per_step * pp}")
    return None
