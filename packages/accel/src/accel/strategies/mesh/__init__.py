"""N-D parallelism on a device mesh: tensor and context parallelism composed with FSDP2."""
