"""``accel.utils.compat`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.ckpt_adapters`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.ckpt_adapters import (
    PathLike as PathLike,
)
from accel.ckpt_adapters import (
    convert_file_size_to_int as convert_file_size_to_int,
)
from accel.ckpt_adapters import (
    dtype_byte_size as dtype_byte_size,
)
from accel.ckpt_adapters import (
    has_offloaded_params as has_offloaded_params,
)
from accel.ckpt_adapters import (
    merge_fsdp_weights as merge_fsdp_weights,
)
from accel.patch_forwarding import serve_as_door
from accel_ckpt import (
    parse_size as parse_size,
)
from accel_ckpt.big_modeling.hooks import (
    offloading_hook as offloading_hook,
)
from accel_ckpt.merge_weights import (
    merge_weights as merge_weights,
)
from accel_state import (
    PartialState as PartialState,
)

serve_as_door(__name__, "accel.ckpt_adapters")
