"""Expert parallelism: the MoE MLP's router, dispatch and experts (``moe``), overlapped dispatch
(``moe_overlap``).
"""
