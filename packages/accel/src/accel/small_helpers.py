"""Small general helpers that ``accelerate.utils`` exposes (environment, naming, formatting)."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import re
import socket
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from accel.availability import is_compiled_module, is_port_in_use
from accel.compilation import (
    compile_regions,
    has_compiled_regions,
    has_repeated_blocks,
    is_repeated_blocks,
)
from accel.env_values import get_int_from_env, parse_choice_from_env, parse_flag_from_env
from accel.strategies.compile_regions import compile_regions_deepspeed, compile_regions_fsdp2
from accel.strategies.parallel_info import get_model_tp_size, model_has_dtensor
from accel_ckpt import load, save
from accel_ckpt.big_modeling.model_helpers import (
    clean_state_dict_for_safetensors,
    get_module_children_bottom_up,
)
from accel_ckpt.pickle_io import TORCH_SAFE_GLOBALS
from accel_launch import environment as _launch_environment

# Accelerate's helpers of this module that live elsewhere in accel, under their module path.
__reexported__ = (
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    TORCH_SAFE_GLOBALS,
    clean_state_dict_for_safetensors,
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    get_model_tp_size,
    get_module_children_bottom_up,
    has_compiled_regions,
    has_repeated_blocks,
    is_compiled_module,
    is_port_in_use,
    is_repeated_blocks,
    load,
    model_has_dtensor,
    save,
)

_MIN_KERNEL = (5, 5)
_logger = logging.getLogger("accel.utils.other")
# Accelerate logs the environment file's dropped entries on ``accelerate.utils.environment``.
_ENVIRONMENT_LOGGER = logging.getLogger("accel.utils.environment")


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty ``os.environ``; the environment is restored afterwards."""
    saved = os.environ.copy()
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def convert_bytes(size: float) -> str:
    """A byte count for humans: ``convert_bytes(2048) == "2.0 KB"``."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def merge_dicts(source: dict[str, Any], destination: dict[str, Any]) -> dict[str, Any]:
    """Merge ``source`` into ``destination`` recursively (nested dicts merged, not replaced)."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``getattr`` along a dotted path: ``recursive_getattr(model, "encoder.layer")``."""
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def get_pretty_name(obj: Any) -> str:
    """The qualified name of a class or function (of the object's class otherwise)."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = type(obj)
    return str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or obj)


def extract_model_from_parallel(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """The user's model inside DDP / DataParallel (and, unless kept, ``torch.compile``) wrappers.

    Args:
        model: The model to extract.
        keep_fp32_wrapper: Keep the mixed-precision forward patch.
        keep_torch_compile: Return it still compiled when it was (Accelerate's default).
        recursive: Also unwrap wrapped sub-modules, in place.
    """
    from accel.modeling import unwrap_model

    unwrapped = unwrap_model(
        model,
        keep_fp32_wrapper=keep_fp32_wrapper,
        keep_torch_compile=keep_torch_compile,
        recursive=recursive,
    )
    if not keep_fp32_wrapper:
        _restore_original_forward(getattr(unwrapped, "_orig_mod", unwrapped))
    return unwrapped


def _restore_original_forward(model: torch.nn.Module) -> None:
    """Undo a forward wrapped by hand with ``model._original_forward`` recorded (Accelerate's way).

    The wrappers (``functools.wraps`` chains, ``__wrapped__``) are peeled until the recorded
    forward; the class's own forward is restored by dropping the instance attribute.
    """
    original = model.__dict__.pop("_original_forward", None)
    if original is None:
        return
    forward = model.__dict__.get("forward", original)
    while hasattr(forward, "__wrapped__") and forward != original:
        forward = forward.__wrapped__
    if getattr(forward, "__self__", None) is model and getattr(
        forward, "__func__", None
    ) is getattr(type(model), "forward", None):
        model.__dict__.pop("forward", None)
    else:
        model.forward = forward  # type: ignore[method-assign]


def wait_for_everyone() -> None:
    """Block until every process reaches this call (``PartialState().wait_for_everyone()``)."""
    from accel_state import PartialState

    PartialState().wait_for_everyone()


def check_os_kernel() -> None:
    """Log a warning on Linux kernels older than 5.5, where processes can hang (as Accelerate does)."""
    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found is None:
        return
    version = found.group(0)
    if tuple(int(part) for part in version.split(".")[:2]) < _MIN_KERNEL:
        _logger.warning(
            f"Detected kernel version {version}, which is below the recommended minimum of 5.5.0; "
            "this can cause the process to hang. Upgrade the kernel to 5.5.0 or newer."
        )


def get_free_port() -> int:
    """A TCP port on this machine that was free a moment ago (for ``main_process_port=0``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def is_peft_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` (inside DDP / compile wrappers) is a PEFT ``PeftModel``.

    ``False`` when peft is not installed (it is never imported otherwise).
    """
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        return False
    from peft import PeftModel

    return isinstance(extract_model_from_parallel(model), PeftModel)


def test_launch() -> None:
    """Check that a ``PartialState`` starts in this process (what a launched function first does)."""
    from accel_state import PartialState

    PartialState()


def convert_dict_to_env_variables(current_env: Mapping[str, str]) -> list[str]:
    """Turn ``{"A": "1"}`` into the lines ``A=1`` of an environment file (DeepSpeed's ``.deepspeed_env``).

    Entries that would break such a file are left out with a warning on this module's logger
    (``accel.utils.environment``, the twin of Accelerate's), as Accelerate does.
    """
    return _launch_environment.convert_dict_to_env_variables(current_env, log=_ENVIRONMENT_LOGGER)
