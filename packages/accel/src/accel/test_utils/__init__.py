"""Helpers for users' own tests, at Accelerate's ``accelerate.test_utils`` module path.

Skip decorators by hardware, a launch command, subprocess running, cross-process tensor checks,
and the small regression model and dataset that Accelerate's examples test with.

Example:
    >>> from accel.test_utils import RegressionDataset, RegressionModel, require_multi_gpu
"""

from __future__ import annotations

from accel.test_utils.testing import (
    DEFAULT_LAUNCH_COMMAND,
    SubprocessRunOutput,
    are_the_same_tensors,
    assert_exception,
    capture_call_output,
    device_count,
    execute_subprocess_async,
    get_launch_command,
    get_torch_dist_unique_port,
    require_cpu,
    require_cuda,
    require_fp16,
    require_mps,
    require_multi_device,
    require_multi_gpu,
    require_non_cpu,
    require_non_torch_xla,
    require_single_device,
    require_single_gpu,
    require_torch_min_version,
    require_torchvision,
    require_tpu,
    require_xpu,
    run_first,
    skip,
    slow,
    torch_device,
)
from accel.test_utils.training import RegressionDataset, RegressionModel

__all__ = [
    "DEFAULT_LAUNCH_COMMAND",
    "RegressionDataset",
    "RegressionModel",
    "SubprocessRunOutput",
    "are_the_same_tensors",
    "assert_exception",
    "capture_call_output",
    "device_count",
    "execute_subprocess_async",
    "get_launch_command",
    "get_torch_dist_unique_port",
    "require_cpu",
    "require_cuda",
    "require_fp16",
    "require_mps",
    "require_multi_device",
    "require_multi_gpu",
    "require_non_cpu",
    "require_non_torch_xla",
    "require_single_device",
    "require_single_gpu",
    "require_torch_min_version",
    "require_torchvision",
    "require_tpu",
    "require_xpu",
    "run_first",
    "skip",
    "slow",
    "torch_device",
]
