"""Sharded checkpoints that any layout of the same model can resume: ``checkpoint`` (save, resume),
``checkpoint_dcp`` (torch.distributed.checkpoint), ``checkpoint_files`` (the folder, safely read),
``checkpoint_shards`` (a tensor's shard by layout).
"""
