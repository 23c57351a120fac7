"""The layout, without torch: axes and groups (``axes``), the rules of what builds (``constraints``, ``layouts``),
the per-layer settings (``layer_settings``), the model described (``model_desc``, ``saved_elements``),
placements of pipeline chunks (``placement``), per-layer resharding (``reshard``) and the kernels' size rule
(``kernel_sizes``). The only part of the runtime that ``dsl/`` and ``codegen/``'s passes import (with
``schedules`` and ``paths``); ``tests/test_imports.py`` holds that it imports no torch.
"""
