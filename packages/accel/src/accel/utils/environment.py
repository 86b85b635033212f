"""Accelerate's ``accelerate.utils.environment`` module path: environment-variable helpers."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from accel.fp8.capability import check_cuda_fp8_capability
from accel.utils.amp import get_current_device_type
from accel.utils.env_values import get_int_from_env, parse_choice_from_env, parse_flag_from_env
from accel.utils.gpu_info import (
    are_libraries_initialized,
    check_cuda_p2p_ib_support,
    get_driver_version,
    get_gpu_info,
)
from accel.utils.other import check_os_kernel, clear_environment
from accel_launch import environment as _launch_environment
from accel_launch.affinity import (
    CPUInformation,
    get_cpu_distributed_information,
    override_numa_affinity,
    set_numa_affinity,
)
from accel_launch.environment import purge_accelerate_environment
from accel_state import patch_environment, str_to_bool

_logger = logging.getLogger(__name__)


def convert_dict_to_env_variables(current_env: Mapping[str, str]) -> list[str]:
    """Turn ``{"A": "1"}`` into the lines ``A=1`` of an environment file (DeepSpeed's ``.deepspeed_env``).

    Entries that would break such a file are left out with a warning on this module's logger
    (``accel.utils.environment``, the twin of Accelerate's), as Accelerate does.
    """
    return _launch_environment.convert_dict_to_env_variables(current_env, log=_logger)


__all__ = [
    "CPUInformation",
    "convert_dict_to_env_variables",
    "get_cpu_distributed_information",
    "override_numa_affinity",
    "purge_accelerate_environment",
    "set_numa_affinity",
    "are_libraries_initialized",
    "check_cuda_fp8_capability",
    "check_cuda_p2p_ib_support",
    "get_current_device_type",
    "get_driver_version",
    "get_gpu_info",
    "check_os_kernel",
    "clear_environment",
    "get_int_from_env",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "str_to_bool",
]
