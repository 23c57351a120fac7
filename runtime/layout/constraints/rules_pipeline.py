"""The pipeline: schedules, stages, terapipe slices, chimera, zero bubble."""

from __future__ import annotations



from ..rule_engine import BUILD, _violation, divisors, entries, rule, some
from ..rule_keys import KEYS



@rule("PAR0263")
def terapipe_slices(schedule, slices, seq_len, slice_lengths=None):
    """terapipe(slices = S) cuts every sequence into S equal token slices."""
    if schedule != "terapipe" or slice_lengths is not None or seq_len % slices == 0:
        return None
    fits = [n for n in range(2, min(seq_len, 16) + 1) if seq_len % n == 0]
    return _violation("PAR0263", ("parallel.schedule", "model.seq_len"),
                      f"schedule = terapipe(slices = {slices}) cuts each sequence into equal token slices, "
                      f"but seq_len = {seq_len} is not divisible by {slices}",
                      f"use slices = {', '.join(map(str, fits[:4])) or 'a divisor of seq_len'}")



@rule("PAR0265")
def terapipe_slice_lengths(schedule, slice_lengths, seq_len):
    """terapipe(slices = [n0, n1, ...]) cuts every sequence into slices of those token
    lengths (uneven, as the paper's; ``slices`` is their count); each is at least 1 (the
    key table's element)."""
    if schedule != "terapipe" or sum(slice_lengths) == seq_len:
        return None
    slices = list(slice_lengths)
    written = "[" + ", ".join(map(str, slices)) + "]"
    last = seq_len - sum(slices[:-1])
    fix = [*slices[:-1], last] if last >= 1 else None
    hint = (f"make the last slice {last} tokens: slices = [{', '.join(map(str, fix))}]" if fix else
            f"use lengths that add up to {seq_len}, or slices = S for S equal slices")
    return _violation("PAR0265", ("parallel.schedule", "model.seq_len"),
                      f"schedule = terapipe(slices = {written}) cuts each sequence into slices of these token "
                      f"lengths, but they sum to {sum(slices)}, not seq_len = {seq_len}", hint)



@rule("PAR0267")
def terapipe_slices_under_sp(schedule, slices, seq_len, sp, tp, slice_lengths=None, tp_2d=None):
    """Under sp each tp rank holds n/tp tokens of a slice of n (terapipe.py, Note [slices
    under sequence parallelism]): every slice's length is a multiple of tp (a 2D grid's
    row of C ranks splits the tokens: not with terapipe, PAR0264)."""
    if schedule != "terapipe" or sp is not True or tp < 2 or tp_2d:
        return None
    lengths = list(slice_lengths) if slice_lengths is not None else (
        [seq_len // slices] * slices if seq_len % slices == 0 else [])  # else PAR0263
    if sum(lengths) != seq_len or all(n % tp == 0 for n in lengths):
        return None  # PAR0265, or every slice splits over tp
    written = f"[{', '.join(map(str, lengths))}]" if slice_lengths is not None else str(slices)
    fits = [s for s in range(2, min(seq_len // tp, 16) + 1) if (seq_len // tp) % s == 0]
    return _violation("PAR0267", ("parallel.schedule", "parallel.sp"),
                      f"schedule = terapipe(slices = {written}) cuts each sequence into slices of "
                      f"{', '.join(map(str, dict.fromkeys(lengths)))} tokens, but sp = true splits each slice over "
                      f"tp = {tp}: every slice's length must be a multiple of {tp}",
                      f"use slices = {', '.join(map(str, fits[:4])) or 'S with seq_len / S a multiple of tp'}, "
                      f"lengths that are multiples of {tp}, or sp = false")



PIPELINE_UNITS = 65_536
"""Most forward/backward units (micro-batch · chunk · slice) one pipeline rank's schedule may
hold a step: ``parc build`` builds and simulates the whole schedule (the trainer builds it too),
a list per unit, so 2³¹ micro-batches would never finish. Real pipelines run hundreds."""



@rule("PAR0266")
def pipeline_units(global_batch, micro_batch, dp, pp, chunks=None, slices=None, schedule=None):
    if pp < 2 or global_batch % (micro_batch * dp):
        return None  # no pipeline, or PAR0208
    grad_accum = global_batch // (micro_batch * dp)
    per_slice = slices if schedule == "terapipe" and slices else 1
    chunks = 2 if schedule == "zero_bubble_v" else chunks  # the V's two chunks a rank (schedule.FIXED_CHUNKS)
    units = grad_accum * (chunks or 1) * per_slice
    if units <= PIPELINE_UNITS:
        return None
    sliced = per_slice > 1 and grad_accum * (chunks or 1) <= PIPELINE_UNITS
    return _violation("PAR0266", ("parallel.schedule",) if sliced else ("train.global_batch", "train.micro_batch"),
                      f"the pipeline schedule runs micro-batches · chunks · slices = {grad_accum}·{chunks or 1}·"
                      f"{per_slice} = {units:,} forward and backward units per rank a step, but parc builds "
                      f"schedules of at most {PIPELINE_UNITS:,}",
                      "use fewer slices" if sliced else
                      "raise micro_batch or dp (micro-batches = global_batch / (micro_batch·dp)), or lower global_batch")



@rule("PAR0260")
def zero_bubble_v_stages(schedule, layers, pp, stage_layers=None):
    """ZB-V holds two chunks per rank (runtime/layout/placement.py, Note [placements]): the
    layers split evenly into 2·pp stages (``schedule.FIXED_CHUNKS``; not imported:
    builds ship constraints alone)."""
    if schedule != "zero_bubble_v" or pp < 2:
        return None
    if stage_layers is not None:
        return _violation("PAR0260", "parallel.stage_layers",
                          "stage_layers cannot be combined with schedule = zero_bubble_v",
                          "remove stage_layers: ZB-V splits the layers evenly into 2·pp stages, two a rank")
    if layers % (2 * pp) == 0:
        return None
    fits = [d // 2 for d in divisors(layers) if d % 2 == 0 and d // 2 >= 2]
    return _violation("PAR0260", ("parallel.schedule", "parallel.pp"),
                      f"schedule = zero_bubble_v splits layers = {layers} into 2·pp = {2 * pp} stages "
                      f"(two a rank, in a V), but {layers} / {2 * pp} = {layers / (2 * pp):g}",
                      f"pp must be one of {some(fits, pp)}" if fits
                      else f"layers = {layers} is odd: use schedule = zero_bubble")



@rule("PAR0261")
def chimera_pipelines(schedule, pp):
    """Chimera pairs pipeline rank r with p-1-r (runtime/layout/placement.py): p even."""
    if schedule != "chimera" or pp % 2 == 0:
        return None
    return _violation("PAR0261", ("parallel.schedule", "parallel.pp"),
                      f"schedule = chimera runs two pipelines that pair rank r with rank pp-1-r, "
                      f"so pp must be even, but pp = {pp}",
                      f"use pp = {pp + 1 if pp > 1 else 2}, or schedule = 1f1b")




@rule("PAR0212")
def interleaved_needs_pipeline(chunks, pp):
    if chunks > 1 and pp < 2:
        return _violation("PAR0212", "parallel.schedule",
                          f"schedule = interleaved(chunks = {chunks}) needs pp ≥ 2, but pp = {pp}",
                          "use interleaving with a pipeline, or schedule = 1f1b")
    return None



@rule("PAR0206")
def stage_layers_fit(stage_layers, layers=None, pp=None, chunks=None):
    """One entry per virtual stage, in model order: pp of them, or pp·chunks under an
    interleaved schedule (virtual stage v on pipeline rank v mod pp, as Megatron places
    them; Llama 3 405B's layout: a layer fewer on the first and the last)."""
    if chunks is not None and chunks > 1 and pp is not None and pp < 2:
        return None  # interleaved_needs_pipeline
    found = []
    interleaved = chunks is not None and chunks > 1
    if pp is not None and len(stage_layers) != pp * (chunks if interleaved else 1):
        found.append(_violation(
            "PAR0206", "parallel.stage_layers",
            f"stage_layers has {len(stage_layers)} entries, but interleaved(chunks = {chunks}) runs pp·chunks = "
            f"{pp}·{chunks} = {pp * chunks} virtual stages" if interleaved else
            f"stage_layers has {len(stage_layers)} entries, but pp = {pp}",
            "give one entry per virtual stage, in model order (stage v runs on pipeline rank v mod pp)"
            if interleaved else "give one entry per stage"))
    if layers is not None and sum(stage_layers) != layers:
        total = " + ".join(str(n) for n in stage_layers)
        found.append(_violation("PAR0206", "parallel.stage_layers",
                                f"stage_layers sum to {total} = {sum(stage_layers)}, but layers = {layers}",
                                "the stages together hold every layer once"))
    return tuple(found)



@rule("PAR0205")
def layers_split_evenly(layers, pp, chunks, stage_layers=None):
    if stage_layers is not None or (chunks > 1 and pp < 2):
        return None
    stages = pp * chunks
    if layers % stages == 0:
        return None
    formula = f"pp·chunks = {pp}·{chunks} = {stages}" if chunks > 1 else f"pp = {pp}"
    if chunks == 1:
        hint = f"pp must divide layers = {layers}: one of {some(divisors(layers), pp)}; or give stage_layers"
    else:
        fits = [d // chunks for d in divisors(layers) if d % chunks == 0 and d // chunks >= 2]
        hint = (f"with chunks = {chunks}, pp must be one of {some(fits, pp)}" if fits
                else f"chunks = {chunks} does not divide layers = {layers}")
    return _violation("PAR0205", "parallel.pp",
                      f"layers = {layers} cannot be split evenly into {formula} stages "
                      f"({layers} / {stages} = {layers / stages:g})", hint)
