"""Accelerate's ``accelerate.utils.environment`` module path: environment-variable helpers."""

from __future__ import annotations

from accel.amp import get_current_device_type
from accel.env_files import convert_dict_to_env_variables
from accel.env_values import (
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
)
from accel.fp8.capability import check_cuda_fp8_capability
from accel.gpu_info import (
    are_libraries_initialized,
    check_cuda_p2p_ib_support,
    get_driver_version,
    get_gpu_info,
)
from accel.kernel_check import check_os_kernel
from accel_launch.affinity import (
    CPUInformation,
    get_cpu_distributed_information,
    override_numa_affinity,
    set_numa_affinity,
)
from accel_launch.environment import clear_environment, purge_accelerate_environment
from accel_state import patch_environment, str_to_bool

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
