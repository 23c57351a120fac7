"""AdamW, the LR schedule and clipping (``optim``), fp32 master weights (``master``), fp16 loss
scaling (``loss_scale``).
"""
