"""``accelerate.utils.launch``: the launch helpers, from accel-launch (no logic here)."""

import subprocess
from shutil import which

from accel.utils.environment import convert_dict_to_env_variables
from accel_launch.affinity import (
    CPUInformation,
    get_cpu_distributed_information,
    override_numa_affinity,
    set_numa_affinity,
)
from accel_launch.environment import purge_accelerate_environment
from accel_launch.launch_helpers import (
    PrepareForLaunch,
    _convert_nargs_to_dict,
    env_var_path_add,
    prepare_deepspeed_cmd_env,
    prepare_extend_env_parallelism_config,
    prepare_multi_gpu_env,
    prepare_sagemager_args_inputs,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
    setup_fp8_env,
)
from accel_launch.launch_helpers import filter_args as _filter_args

__all__ = [
    "_convert_nargs_to_dict",
    "_filter_args",
    "CPUInformation",
    "PrepareForLaunch",
    "convert_dict_to_env_variables",
    "env_var_path_add",
    "get_cpu_distributed_information",
    "override_numa_affinity",
    "prepare_deepspeed_cmd_env",
    "prepare_extend_env_parallelism_config",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "purge_accelerate_environment",
    "set_numa_affinity",
    "setup_fp8_env",
    "subprocess",
    "which",
]
