"""Accelerate's ``accelerate.utils.other`` module path: a door to the helpers' domain modules.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.availability import (
    is_compiled_module as is_compiled_module,
)
from accel.availability import (
    is_port_in_use as is_port_in_use,
)
from accel.compilation import (
    compile_regions as compile_regions,
)
from accel.compilation import (
    has_compiled_regions as has_compiled_regions,
)
from accel.compilation import (
    has_repeated_blocks as has_repeated_blocks,
)
from accel.compilation import (
    is_repeated_blocks as is_repeated_blocks,
)
from accel.env_values import (
    get_int_from_env as get_int_from_env,
)
from accel.env_values import (
    parse_choice_from_env as parse_choice_from_env,
)
from accel.env_values import (
    parse_flag_from_env as parse_flag_from_env,
)
from accel.kernel_check import (
    check_os_kernel as check_os_kernel,
)
from accel.modeling import (
    extract_model_from_parallel as extract_model_from_parallel,
)
from accel.naming import (
    get_pretty_name as get_pretty_name,
)
from accel.nested_access import (
    merge_dicts as merge_dicts,
)
from accel.nested_access import (
    recursive_getattr as recursive_getattr,
)
from accel.patch_forwarding import serve_as_door
from accel.process_control import (
    wait_for_everyone as wait_for_everyone,
)
from accel.strategies.compile_regions import (
    compile_regions_deepspeed as compile_regions_deepspeed,
)
from accel.strategies.compile_regions import (
    compile_regions_fsdp2 as compile_regions_fsdp2,
)
from accel.strategies.parallel_info import (
    get_model_tp_size as get_model_tp_size,
)
from accel.strategies.parallel_info import (
    model_has_dtensor as model_has_dtensor,
)
from accel_ckpt import (
    load as load,
)
from accel_ckpt import (
    save as save,
)
from accel_ckpt.big_modeling.model_helpers import (
    clean_state_dict_for_safetensors as clean_state_dict_for_safetensors,
)
from accel_ckpt.big_modeling.model_helpers import (
    get_module_children_bottom_up as get_module_children_bottom_up,
)
from accel_ckpt.pickle_io import (
    TORCH_SAFE_GLOBALS as TORCH_SAFE_GLOBALS,
)
from accel_ckpt.sizes import (
    convert_bytes as convert_bytes,
)
from accel_launch.environment import (
    clear_environment as clear_environment,
)
from accel_launch.notebook import (
    get_free_port as get_free_port,
)

serve_as_door(
    __name__,
    "accel.kernel_check",
    "accel.modeling",
    "accel.naming",
    "accel.nested_access",
    "accel.process_control",
)
