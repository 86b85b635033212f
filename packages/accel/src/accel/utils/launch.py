"""``accelerate.utils.launch``: the launch helpers, from accel-launch (no logic here)."""

from accel_launch.affinity import (
    CPUInformation,
    get_cpu_distributed_information,
    override_numa_affinity,
    set_numa_affinity,
)
from accel_launch.environment import convert_dict_to_env_variables, purge_accelerate_environment
from accel_launch.launch_helpers import (
    PrepareForLaunch,
    prepare_deepspeed_cmd_env,
    prepare_multi_gpu_env,
    prepare_sagemager_args_inputs,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
)
from accel_launch.launch_helpers import script_args_to_hyperparameters as _convert_nargs_to_dict

__all__ = [
    "_convert_nargs_to_dict",
    "CPUInformation",
    "PrepareForLaunch",
    "convert_dict_to_env_variables",
    "get_cpu_distributed_information",
    "override_numa_affinity",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "purge_accelerate_environment",
    "set_numa_affinity",
]
