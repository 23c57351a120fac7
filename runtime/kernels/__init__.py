"""Compiled kernels for the runtime (fused ops with autograd). Filled in by a later issue."""
