"""Pipeline parallelism: the executor (``pipeline``), point-to-point (``p2p``), and a module each
for what a schedule kind or option adds (split backward, token slices, compressed boundaries).
"""
