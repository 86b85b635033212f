"""Accelerate's ``accelerate.utils.other`` module path: a door to :mod:`accel.small_helpers`."""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.small_helpers import (
    TORCH_SAFE_GLOBALS as TORCH_SAFE_GLOBALS,
)
from accel.small_helpers import (
    check_os_kernel as check_os_kernel,
)
from accel.small_helpers import (
    clean_state_dict_for_safetensors as clean_state_dict_for_safetensors,
)
from accel.small_helpers import (
    clear_environment as clear_environment,
)
from accel.small_helpers import (
    compile_regions as compile_regions,
)
from accel.small_helpers import (
    compile_regions_deepspeed as compile_regions_deepspeed,
)
from accel.small_helpers import (
    compile_regions_fsdp2 as compile_regions_fsdp2,
)
from accel.small_helpers import (
    convert_bytes as convert_bytes,
)
from accel.small_helpers import (
    extract_model_from_parallel as extract_model_from_parallel,
)
from accel.small_helpers import (
    get_free_port as get_free_port,
)
from accel.small_helpers import (
    get_int_from_env as get_int_from_env,
)
from accel.small_helpers import (
    get_model_tp_size as get_model_tp_size,
)
from accel.small_helpers import (
    get_module_children_bottom_up as get_module_children_bottom_up,
)
from accel.small_helpers import (
    get_pretty_name as get_pretty_name,
)
from accel.small_helpers import (
    has_compiled_regions as has_compiled_regions,
)
from accel.small_helpers import (
    has_repeated_blocks as has_repeated_blocks,
)
from accel.small_helpers import (
    is_compiled_module as is_compiled_module,
)
from accel.small_helpers import (
    is_port_in_use as is_port_in_use,
)
from accel.small_helpers import (
    is_repeated_blocks as is_repeated_blocks,
)
from accel.small_helpers import (
    load as load,
)
from accel.small_helpers import (
    merge_dicts as merge_dicts,
)
from accel.small_helpers import (
    model_has_dtensor as model_has_dtensor,
)
from accel.small_helpers import (
    parse_choice_from_env as parse_choice_from_env,
)
from accel.small_helpers import (
    parse_flag_from_env as parse_flag_from_env,
)
from accel.small_helpers import (
    recursive_getattr as recursive_getattr,
)
from accel.small_helpers import (
    save as save,
)
from accel.small_helpers import (
    wait_for_everyone as wait_for_everyone,
)

serve_as_door(__name__, "accel.small_helpers")
