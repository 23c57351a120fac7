"""Training: warmup, token ids."""

from __future__ import annotations



from ..rule_engine import _violation, rule



@rule("PAR0213")
def warmup_within_steps(warmup, steps, decay=None):
    """Warmup (and ``wsd``'s decay after it) fit in the run: ``warmup + decay <= steps``."""
    if decay is None:
        if warmup <= steps:
            return None
        return _violation("PAR0213", ("train.schedule.warmup", "train.schedule"),
                          f"warmup = {warmup} is more than steps = {steps}", f"warmup is counted in steps: at most {steps}")
    if warmup + decay <= steps:
        return None
    return _violation("PAR0213", ("train.schedule.decay", "train.schedule"),
                      f"warmup + decay = {warmup} + {decay} = {warmup + decay} is more than steps = {steps}",
                      f"the decay is the run's last steps, after the warmup: decay at most {max(steps - warmup, 0)}"
                      f" with warmup = {warmup}")



TOKEN_IDS = {"uint16": 2**16, "uint32": 2**32}



@rule("PAR0214")
def vocab_fits_tokens(data, vocab, data_dtype=None):
    dtype = data_dtype or "uint16"
    if data != "tokens" or dtype != "uint16" or vocab <= TOKEN_IDS[dtype]:
        return None
    return _violation("PAR0214", ("train.data.dtype", "train.data"),
                      f"vocab = {vocab} does not fit the token file's dtype uint16 (at most 65536 ids)",
                      'write tokens("...", dtype = uint32)')



@rule("PAR0216")
def blend_weights_per_file(data, data_files=None, data_weights=None, data_val_files=None):
    """A blend (``tokens([...], weights = [...])``) has one weight per token file and, with
    ``val``, one validation file or one per token file."""
    if data != "tokens" or data_files is None:
        return None
    if data_weights is not None and data_weights != data_files:
        files = "one file" if data_files == 1 else f"{data_files} files"
        return _violation("PAR0216", ("train.data",),
                          f"tokens(...) has {files} but {data_weights} weight{'s' * (data_weights != 1)}",
                          "give one weight per file, in the order of the files (tokens([\"a.bin\", \"b.bin\"], "
                          "weights = [0.3, 0.7])), or leave weights out for equal shares")
    if data_val_files is not None and data_val_files not in (1, data_files):
        return _violation("PAR0216", ("train.data",),
                          f"tokens(...) reads {data_files} file{'s' * (data_files != 1)} but names "
                          f"{data_val_files} validation files",
                          "name one validation file, or one per file of the blend (blended by the same "
                          "weights), or leave val out to hold out each file's last tenth")
    return None
