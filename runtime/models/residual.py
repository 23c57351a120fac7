"""The pending residual add (Note [pending residual] in model.py), shared by the blocks
(model.py) and the sub-batch wavefront (parallel/tensor/overlap.py), which imports it
from here rather than from the model that imports it.
"""


def settle(h, delta):
    """The residual stream with a pending branch output added (Note [pending residual])."""
    return h if delta is None else h + delta
