"""Tensor parallelism: the split layers (``layers``, 2D: ``layers2d``), the plan table (``tp_plan``) and
Oases sub-batch overlap (``overlap``).
"""
