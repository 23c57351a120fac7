"""Pipeline parallelism: the executor (``pipeline``), point-to-point (``p2p``), split backward
(``split_backward``), TeraPipe slices (``terapipe``), compressed stage boundaries (``compress_pp``).
"""
