"""The generator a dataset draws sample ``index`` from: a function of (seed, index) alone,
so every layout reads the same samples (``data.py``'s synthetic data, ``tokens.py``'s windows).
"""

from __future__ import annotations

import torch


def sample_generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 6_364_136_223_846_793_005 + index * 1_442_695_040_888_963_407) % (2**63))
