"""Training: warmup, token ids."""

from __future__ import annotations



from ..rule_engine import _violation, rule



@rule("PAR0213")
def warmup_within_steps(warmup, steps):
    if warmup <= steps:
        return None
    return _violation("PAR0213", ("train.schedule.warmup", "train.schedule"),
                      f"warmup = {warmup} is more than steps = {steps}", f"warmup is counted in steps: at most {steps}")



TOKEN_IDS = {"uint16": 2**16, "uint32": 2**32}



@rule("PAR0214")
def vocab_fits_tokens(data, vocab, data_dtype=None):
    dtype = data_dtype or "uint16"
    if data != "tokens" or dtype != "uint16" or vocab <= TOKEN_IDS[dtype]:
        return None
    return _violation("PAR0214", ("train.data.dtype", "train.data"),
                      f"vocab = {vocab} does not fit the token file's dtype uint16 (at most 65536 ids)",
                      'write tokens("...", dtype = uint32)')
