"""The transformer (``model``: GPT, Llama, MoE blocks) and counter-based initialization (``param_init``).
"""
