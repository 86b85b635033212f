"""DeepSpeed ZeRO: the strategy, its plugin and named plugins, config resolution and checkpoints.

Nothing here imports ``deepspeed`` until a job uses it.
"""
