"""XLA devices (TPU, XLA on CPU/GPU) through torch_xla: the strategy."""
