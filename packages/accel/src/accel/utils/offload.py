"""Accelerate's ``accelerate.utils.offload``: weights offloaded to disk as numpy memory maps.

The implementations live with model loading in accel-ckpt (``accel_ckpt.big_modeling.offload``).

Example:
    >>> from accel.utils.offload import extract_submodules_state_dict
    >>> sorted(extract_submodules_state_dict({"a.w": 1, "b.w": 2}, ["a"]))
    ['a.w']
"""

from __future__ import annotations

from accel_ckpt.big_modeling.model_helpers import extract_submodules_state_dict
from accel_ckpt.big_modeling.offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)

__all__ = [
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "extract_submodules_state_dict",
    "load_offloaded_weight",
    "offload_state_dict",
    "offload_weight",
    "save_offload_index",
]
