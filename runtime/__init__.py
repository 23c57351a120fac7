"""parc's runtime: what generated trainers import (as ``parc_runtime``).

Modules: ``mesh`` (processes, groups), ``comm`` (communication mappings, the exposed
communication clock, asynchronous launches), ``layers`` (tensor-parallel layers),
``overlap`` (Oases sub-batches), ``model_desc`` (the model described without torch:
modules, shapes, parameter counts, FLOPs, saved activations; ``saved_elements``),
``model`` (GPT and Llama; it uses ``tp_plan``, the checked plan table, and
``param_init``, init before sharding), ``data`` (samples by global
index), ``optim`` (AdamW, LR schedule, clipping), ``dp`` (data-parallel gradient
buckets, overlapping backward), ``zero`` (ZeRO-1/2), ``metrics`` (what each step logs), ``constraints`` (the layout and
buildability rules parc check, parc build and the search share; torch-free). Relative imports
and torch only, so the same files work as ``parc.runtime`` and as a build's vendored
``parc_runtime``.
The API is listed in parc's docs/runtime-api.md.
"""
