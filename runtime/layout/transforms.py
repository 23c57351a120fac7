"""The order of the transforms that make a layout of the plain model.

Takes: nothing. Gives: ``ORDER``, the steps of ``runtime/models/parallelize.py`` in the
one order they may run, and ``STEPS``, what each does. Torch-free: the renderer writes
``train.py``'s transform lines in this order and the runtime refuses any other.

Note [the order of the transforms]: ``build_model`` makes the plain model on the meta
device (no values), then each step changes it in place:
- ``tensor`` first: it swaps layers for their tensor-parallel kinds (1D, 2D, per-layer
  degrees), and every later step works on the layers that will run;
- ``context`` gives every attention core its strategy over the cp ranks;
- ``experts`` keeps this rank's experts and its slice of each, after the tensor
  step since the expert dispatch under tp reads the block's tp group;
- ``recompute`` and ``overlap`` set how each block runs (per layer), after the layers
  are final, since ``overlap``'s sub-batch walk runs the swapped layers' collectives;
- then ``init_weights`` generates each rank's values (Note [counter-based init]), or
  under ZeRO-3 leaves them to the optimizer, and ``use_kernels`` routes the ops.
A step may be skipped (a layout without it); none may run twice or after a later one.
"""

from __future__ import annotations

ORDER = ("tensor", "context", "experts", "recompute", "overlap")

STEPS = {
    "tensor": "split layers over tp (1D, 2D grid, per-layer degrees): parallel/tensor/sharding.py",
    "context": "attention over the cp ranks (ring, ulysses, allgather): parallel/context/context.py",
    "experts": "this rank's experts and its slice of each: parallel/expert/moe.py",
    "recompute": "what each block redoes in backward (none, selective, full)",
    "overlap": "each block's sub-batches (Oases): parallel/tensor/overlap.py",
}
