"""Putting loaded tensors into a model: device maps, dtypes, meta parameters and tied weights."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

from accel_ckpt.atomic import atomic_file
from accel_ckpt.dtypes import dtype_name
from accel_ckpt.errors import InvalidArgumentError, StateDictMismatchError
from accel_ckpt.memory import tensor_bytes
from accel_ckpt.safetensors_io import cpu_contiguous
from accel_state.torch_compat import accelerator_module

logger = logging.getLogger(__name__)

DeviceLike = int | str | torch.device
#: ``device_map`` value that sends a tensor to ``offload_folder`` instead of memory.
DISK = "disk"


def _as_device(value: DeviceLike, prefix: str) -> torch.device | str:
    if isinstance(value, str) and value == DISK:
        return DISK
    if isinstance(value, int) and not isinstance(value, bool):
        accelerator = accelerator_module()
        current = accelerator.current_accelerator() if accelerator is not None else None
        return torch.device(current.type if current is not None else "cuda", value)
    try:
        return torch.device(value)
    except (RuntimeError, TypeError):
        raise InvalidArgumentError(
            f"device_map[{prefix!r}]={value!r} is not a device; use 'cpu', 'cuda:0', an int GPU "
            "index or 'disk'."
        ) from None


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``dtype`` as a ``torch.dtype`` (``"float16"`` and ``"torch.float16"`` are accepted).

    Raises:
        InvalidArgumentError: The string names no torch dtype.
    """
    if not isinstance(dtype, str):
        return dtype
    resolved = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise InvalidArgumentError(
            f"dtype={dtype!r} is not a torch dtype; use e.g. torch.float16 or 'bfloat16'."
        )
    return resolved


def _in_module(name: str, module: str) -> bool:
    """Whether state-dict key ``name`` is ``module`` or lies inside a module of that (dotted) name.

    ``"wo"`` matches ``"wo"``, ``"wo.weight"`` and ``"h.0.wo.weight"``, not ``"h.0.two.weight"``.
    """
    return name == module or f".{module}." in f".{name}"


class Placer:
    """Assigns checkpoint tensors to a model's parameters and buffers.

    Args:
        model: The (unwrapped) model.
        device_map: ``{"": device}`` or module-prefix -> device (longest prefix wins); ``None``
            keeps each tensor where it is (meta tensors go to the CPU).
        dtype: Cast floating-point values to this dtype (``None``: the model's dtype).
        keep_in_fp32_modules: Module names whose floating-point values stay float32 when
            ``dtype`` is float16 (as in Accelerate; other dtypes apply to them too).
        offload_folder: Where ``"disk"`` tensors are written.
        offload_buffers: Also send buffers mapped to ``"disk"`` there (else they go to the CPU).

    """

    def __init__(
        self,
        model: nn.Module,
        device_map: Mapping[str, DeviceLike] | None = None,
        dtype: torch.dtype | str | None = None,
        keep_in_fp32_modules: Iterable[str] | None = None,
        offload_folder: str | os.PathLike[str] | None = None,
        offload_buffers: bool = False,
    ) -> None:
        self.model = model
        self.device_map = (
            {prefix: _as_device(value, prefix) for prefix, value in device_map.items()}
            if device_map is not None
            else None
        )
        self.dtype = resolve_dtype(dtype)
        self.keep_in_fp32 = tuple(keep_in_fp32_modules or ())
        self.offload_folder = Path(offload_folder) if offload_folder is not None else None
        self.offload_buffers = offload_buffers
        self.offload_index: dict[str, dict[str, object]] = {}
        if self.device_map and DISK in self.device_map.values() and self.offload_folder is None:
            raise InvalidArgumentError(
                "device_map sends weights to 'disk' but offload_folder is None; pass "
                "offload_folder='some/folder'."
            )
        # Every (module, attribute) slot holding each tensor, so tied weights stay tied.
        self.slots: dict[str, tuple[nn.Module, str, bool]] = {}
        self.holders: dict[int, list[tuple[nn.Module, str, bool]]] = {}
        for prefix, module in model.named_modules(remove_duplicate=False):
            for table, is_param in ((module._parameters, True), (module._buffers, False)):
                for leaf, tensor in table.items():
                    if tensor is None:
                        continue
                    name = f"{prefix}.{leaf}" if prefix else leaf
                    self.slots[name] = (module, leaf, is_param)
                    self.holders.setdefault(id(tensor), []).append((module, leaf, is_param))

    def current(self, name: str) -> torch.Tensor:
        """The model's tensor for state-dict key ``name``."""
        module, leaf, is_param = self.slots[name]
        table = module._parameters if is_param else module._buffers
        tensor = table[leaf]
        assert tensor is not None
        return tensor

    def device_for(self, name: str) -> torch.device | str:
        """Where ``name`` goes: a device or ``"disk"``."""
        if self.device_map is None:
            current = self.current(name)
            return torch.device("cpu") if current.device.type == "meta" else current.device
        best: torch.device | str | None = None
        best_length = -1
        for prefix, device in self.device_map.items():
            matches = prefix == "" or name == prefix or name.startswith(prefix + ".")
            if matches and len(prefix) > best_length:
                best, best_length = device, len(prefix)
        if best is None:
            raise InvalidArgumentError(
                f"device_map has no entry for {name!r}; add its module (or '' for everything) "
                f"to device_map (keys now: {sorted(self.device_map)})."
            )
        if best == DISK and not self.offload_buffers and not self.slots[name][2]:
            return torch.device("cpu")
        return best

    def dtype_for(self, name: str, value: torch.Tensor) -> torch.dtype:
        """The dtype ``value`` takes in the model."""
        if value.is_floating_point() and self.dtype is not None:
            if self.dtype == torch.float16 and any(
                _in_module(name, keep) for keep in self.keep_in_fp32
            ):
                return torch.float32
            return self.dtype
        return self.current(name).dtype

    def reads_in_place(self, name: str) -> bool:
        """Whether the file's bytes may be read straight into the model's current tensor."""
        current = self.current(name)
        if current.device.type == "meta":
            return False
        device = self.device_for(name)
        return device == current.device and self.dtype_for(name, current) == current.dtype

    def _copied_to(self, name: str) -> torch.device | None:
        """The device tensor ``name`` is copied to when assigned (``None``: in place or disk)."""
        if self.device_map is None or self.reads_in_place(name):
            return None
        device = self.device_for(name)
        return device if isinstance(device, torch.device) else None

    def keeps_on_cpu(self, name: str, dtype: torch.dtype) -> bool:
        """Whether a file tensor of ``dtype`` becomes the model's CPU tensor ``name`` unchanged.

        Such tensors may be memory-mapped views of the file instead of copies.
        """
        device = self._copied_to(name)
        sample = torch.empty(0, dtype=dtype)
        return device is not None and device.type == "cpu" and self.dtype_for(name, sample) == dtype

    def goes_to_accelerator(self, name: str) -> bool:
        """Whether tensor ``name`` is copied to a GPU (or other accelerator) when assigned.

        Such tensors are best read as views of a memory map of the file: the copy to the device
        reads them once from the page cache, with no intermediate host buffer to fill.
        """
        device = self._copied_to(name)
        return device is not None and device.type not in ("cpu", "meta")

    def check_shape(self, name: str, shape: tuple[int, ...], source: str) -> str | None:
        """A description of the mismatch, or ``None`` when the shapes agree."""
        expected = tuple(self.current(name).shape)
        if expected == tuple(shape):
            return None
        return f"{name!r}: {source} has shape {list(shape)}, the model {list(expected)}"

    def assign(self, name: str, value: torch.Tensor, source: str, owned: bool = False) -> None:
        """Put ``value`` into the model under ``name`` (in place when device and dtype allow).

        ``owned``: ``value`` is a fresh tensor nobody else holds; it is used without a copy
        when it already has the right device and dtype.
        """
        current = self.current(name)
        if value is current:
            return
        problem = self.check_shape(name, tuple(value.shape), source)
        if problem is not None:
            raise StateDictMismatchError(
                f"Cannot load {problem}. Load into a model built with the same configuration."
            )
        device = self.device_for(name)
        if device == DISK:
            self._offload(name, value)
            return
        dtype = self.dtype_for(name, value)
        if current.device.type != "meta" and current.device == device and current.dtype == dtype:
            with torch.no_grad():
                current.copy_(value)
            return
        if owned and value.device == device and value.dtype == dtype:
            data = value.detach()
        else:
            data = value.detach().to(device=device, dtype=dtype, copy=True)
        module, leaf, is_param = self.slots[name]
        replacement: torch.Tensor = (
            nn.Parameter(data, requires_grad=current.requires_grad) if is_param else data
        )
        holders = self.holders.pop(id(current), [(module, leaf, is_param)])
        for holder, holder_leaf, holder_is_param in holders:
            if holder_is_param:
                assert isinstance(replacement, nn.Parameter)
                holder._parameters[holder_leaf] = replacement
            else:
                holder._buffers[holder_leaf] = replacement
        self.holders[id(replacement)] = holders

    def _offload(self, name: str, value: torch.Tensor) -> None:
        assert self.offload_folder is not None
        self.offload_folder.mkdir(parents=True, exist_ok=True)
        data = cpu_contiguous(value)
        dtype = self.dtype_for(name, value)
        if data.dtype != dtype:
            data = data.to(dtype)
        with (
            atomic_file(self.offload_folder / f"{name}.dat") as temporary,
            open(temporary, "wb") as handle,
        ):
            handle.write(tensor_bytes(data))
        self.offload_index[name] = {"dtype": dtype_name(dtype), "shape": list(data.shape)}

    def finish(self) -> None:
        """Write ``offload_folder/index.json`` (name -> dtype and shape) when anything went to disk."""
        if not self.offload_index or self.offload_folder is None:
            return
        path = self.offload_folder / "index.json"
        index: dict[str, object] = {}
        if path.exists():
            index.update(json.loads(path.read_text()))
        index.update(self.offload_index)
        with atomic_file(path) as temporary:
            temporary.write_text(json.dumps(index, indent=2))

    def tied_groups(self) -> dict[str, int]:
        """State-dict key -> id of the tensor behind it (tied keys share an id)."""
        return {name: id(self.current(name)) for name in self.slots}
