"""parc's runtime: what generated trainers import (as ``parc_runtime``).

Packages (DESIGN §3): ``layout`` (torch-free: axes, rules, layouts, the model
description, placement, per-layer settings — what ``dsl/`` and ``codegen/`` read),
``schedules`` (torch-free pipeline schedules and their simulator), ``distributed``
(mesh, communication), ``parallel`` (one package per axis: ``tensor``, ``context``,
``expert``, ``pipeline``, ``data``), ``models`` (the transformer, init), ``optimizers``,
``train`` (data, eval, metrics, memory, faults), ``checkpoints`` and ``kernels``; and
``paths`` (safe reading and writing of the user's files). Relative imports and torch
only, so the same files work as ``parc.runtime`` and as a build's vendored
``parc_runtime``, which holds only the modules its layout uses
(``codegen/runtime_tree.py``). Every module's own name is unique across the packages.
The API is listed in parc's docs/runtime-api.md.
"""
