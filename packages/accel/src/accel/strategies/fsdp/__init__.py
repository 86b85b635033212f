"""Fully sharded data parallelism (FSDP2, FSDP1).

The strategy, its plugin, settings and precision, checkpoints and model/optimizer files.
"""
