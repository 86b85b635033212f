"""Finding, moving and sizing the tensors of a module by their state-dict names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from accel_ckpt.dtypes import CustomDtype
from accel_ckpt.errors import InvalidArgumentError


def named_module_tensors(
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for the parameters and (optionally) buffers of ``module``.

    Args:
        module: The module.
        include_buffers: Also yield buffers.
        recurse: Include sub-modules' tensors (dotted names).
        remove_non_persistent: Skip buffers that ``state_dict()`` leaves out.

    """
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skipped: set[str] = set()
    if remove_non_persistent:
        for prefix, sub in module.named_modules() if recurse else [("", module)]:
            for leaf in sub._non_persistent_buffers_set:
                skipped.add(f"{prefix}.{leaf}" if prefix else leaf)
    for name, buffer in module.named_buffers(recurse=recurse):
        if name not in skipped:
            yield name, buffer


def _owner(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    owner = module
    *path, leaf = tensor_name.split(".")
    for part in path:
        child = getattr(owner, part, None)
        if not isinstance(child, nn.Module):
            raise InvalidArgumentError(
                f"tensor_name={tensor_name!r}: {type(owner).__name__} has no sub-module {part!r}."
            )
        owner = child
    if leaf not in owner._parameters and leaf not in owner._buffers:
        raise InvalidArgumentError(
            f"tensor_name={tensor_name!r}: {type(owner).__name__} has no parameter or buffer "
            f"{leaf!r}."
        )
    return owner, leaf


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: int | str | torch.device,
    value: torch.Tensor | None = None,
    dtype: str | torch.dtype | None = None,
    fp16_statistics: torch.Tensor | None = None,
    tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Put a parameter or buffer of ``module`` on ``device``, optionally with a new value.

    A parameter is replaced by a new ``nn.Parameter`` of the same class and ``requires_grad``
    (so the meta device can be left); with ``value`` its data comes from there (cast to ``dtype``,
    or to the old dtype when the value is floating-point like the old one).

    Args:
        module: The module holding the tensor.
        tensor_name: Its dotted name relative to ``module``.
        device: Target device (``"meta"`` drops the data).
        value: New data; ``None`` moves the current data (impossible from ``meta``).
        dtype: Cast floating-point values to this dtype.
        fp16_statistics: Quantization statistics of an 8-bit weight, stored as the new
            parameter's ``SCB`` attribute (bitsandbytes' ``Int8Params``) on ``device``.
        tied_params_map: ``{data_ptr: {device: tensor}}`` of tied weights already placed: a
            tensor whose source ``data_ptr`` is there with ``device`` reuses that tensor, and a
            newly placed one is recorded, so tied weights share one copy per device.
        non_blocking: Copy asynchronously (``Tensor.to(non_blocking=True)``).
        clear_cache: Empty the target accelerator's cache after the move (not on cpu/meta).

    Raises:
        InvalidArgumentError: No such tensor, or moving a meta tensor without a ``value``.

    """
    owner, leaf = _owner(module, tensor_name)
    is_param = leaf in owner._parameters
    old = owner._parameters[leaf] if is_param else owner._buffers[leaf]
    assert old is not None
    source_ptr = (value if value is not None else old).data_ptr()
    if tied_params_map is not None and device in tied_params_map.get(source_ptr, {}):
        placed = tied_params_map[source_ptr][device]
        if is_param:
            owner._parameters[leaf] = placed  # type: ignore[assignment]
        else:
            owner._buffers[leaf] = placed
        return
    target = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if value is None:
        if old.device.type == "meta" and target.type != "meta":
            raise InvalidArgumentError(
                f"{tensor_name!r} is on the meta device; pass value= to give it data on {target}."
            )
        value = old
    resolved: torch.dtype | None = (
        getattr(torch, dtype.removeprefix("torch.")) if isinstance(dtype, str) else dtype
    )
    if resolved is None and value.is_floating_point() and old.is_floating_point():
        resolved = old.dtype
    if value.shape != old.shape and old.device.type != "meta":
        raise InvalidArgumentError(  # Accelerate's words, which its tests compare exactly
            f'Trying to set a tensor of shape {value.shape} in "{leaf}" (which has shape '
            f"{old.shape}), this looks incorrect."
        )
    new = value.to(
        device=target,
        dtype=resolved if value.is_floating_point() else None,
        non_blocking=non_blocking,
    )
    if is_param:
        param_cls = type(old) if isinstance(old, nn.Parameter) else nn.Parameter
        if not isinstance(new, nn.Parameter) or new.device != value.device:
            new = param_cls(new.detach(), requires_grad=old.requires_grad)
        if fp16_statistics is not None:
            new.SCB = fp16_statistics.to(target, non_blocking=non_blocking)  # type: ignore[attr-defined]
        owner._parameters[leaf] = new  # type: ignore[assignment]
    else:
        new = new.detach()
        owner._buffers[leaf] = new
    if clear_cache and target.type not in ("cpu", "meta"):
        empty_cache = getattr(getattr(torch, target.type, None), "empty_cache", None)
        if callable(empty_cache):
            empty_cache()
    if tied_params_map is not None and source_ptr in tied_params_map:
        tied_params_map[source_ptr].setdefault(device, new)


def find_tied_parameters(model: nn.Module) -> list[list[str]]:
    """Groups of parameter names that share one tensor (tied weights), each sorted.

    Example:
        >>> model.lm_head.weight = model.embed.weight
        >>> find_tied_parameters(model)
        [['embed.weight', 'lm_head.weight']]

    """
    names: dict[int, list[str]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for leaf, param in module._parameters.items():
            if param is None:
                continue
            name = f"{prefix}.{leaf}" if prefix else leaf
            group = names.setdefault(id(param), [])
            if name not in group:
                group.append(name)
    return sorted(sorted(group) for group in names.values() if len(group) > 1)


def tensor_nbytes(tensor: torch.Tensor, dtype: torch.dtype | CustomDtype | None = None) -> int:
    """Bytes ``tensor`` takes in memory, as ``dtype`` when given and ``tensor`` is floating-point.

    A :class:`~accel_ckpt.dtypes.CustomDtype` (a quantized weight: 4-bit, 2-bit) counts its bits
    per element, rounded up to whole bytes.
    """
    if isinstance(dtype, CustomDtype):
        return (tensor.numel() * dtype.bits + 7) // 8
    if dtype is not None and tensor.is_floating_point():
        return tensor.numel() * torch.empty((), dtype=dtype).element_size()
    return tensor.numel() * tensor.element_size()
