"""Data parallelism and sharding: gradient buckets (``dp``), ZeRO-1/2 (``zero``), ZeRO-3 / HSDP
(``fsdp``, ``fsdp_units``), compressed gradients (``compress``), per-layer tp × dp (``hetero``).
"""
