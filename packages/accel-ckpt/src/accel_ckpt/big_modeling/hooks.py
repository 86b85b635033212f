"""Forward hooks that run a module on another device and bring offloaded weights in and out.

A hook wraps ``module.forward``: ``pre_forward`` may change the inputs (and the module),
``post_forward`` the output. :class:`AlignDevicesHook` moves inputs to the module's execution
device and, for offloaded modules, puts the weights there for the call and back on the meta
device afterwards. The attribute names (``_hf_hook``, ``_old_forward``) are Accelerate's, so code
that looks for hooked modules finds these too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from accel_ckpt.big_modeling.offload import PrefixedDataset
from accel_ckpt.big_modeling.tensors import named_module_tensors, set_module_tensor_to_device
from accel_ops import find_device, send_to_device

Device = int | str | torch.device

#: Methods that dispatch_model guards on a dispatched model (removed with its hooks).
_ADDED_ATTRIBUTES = ("to", "cuda", "cpu", "npu", "xpu", "mlu", "sdaa", "musa")


class ModelHook:
    """Base class of hooks: every method returns its input unchanged.

    Attributes:
        no_grad: Run the wrapped forward under ``torch.no_grad()``.

    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is attached; returns the module to use."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Called before forward with its arguments; returns ``(args, kwargs)`` to use."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after forward with its output; returns the output to give back."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed; undoes what ``init_hook`` did."""
        return module


class SequentialHook(ModelHook):
    """Several hooks applied in order (``post_forward`` in the same order as ``pre_forward``)."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = list(hooks)

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Initialise every hook."""
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Run every hook's ``pre_forward``."""
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Run every hook's ``post_forward``."""
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Detach every hook."""
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    hook: ModelHook = module._hf_hook  # type: ignore[assignment]
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)  # type: ignore[operator]
    else:
        output = module._old_forward(*args, **kwargs)  # type: ignore[operator]
    return hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attach ``hook`` to ``module`` (replacing its hook, or chained after it with ``append``).

    Returns:
        The module (as returned by ``hook.init_hook``).

    """
    existing = getattr(module, "_hf_hook", None)
    if append and isinstance(existing, ModelHook):
        hook = SequentialHook(existing, hook)
        existing.detach_hook(module)
    elif isinstance(existing, ModelHook):
        existing.detach_hook(module)
    old_forward: Callable[..., Any]
    if "_old_forward" in module.__dict__:
        old_forward = module.__dict__["_old_forward"]
    else:
        old_forward = module.forward
        module._old_forward = old_forward  # type: ignore[assignment]
    module = hook.init_hook(module)
    module._hf_hook = hook  # type: ignore[assignment]
    forward = functools.partial(_hooked_forward, module)
    functools.update_wrapper(forward, old_forward)
    module.forward = forward  # type: ignore[method-assign]
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of ``module`` (and of its sub-modules with ``recurse``), restoring forward."""
    hook = getattr(module, "_hf_hook", None)
    if isinstance(hook, ModelHook):
        hook.detach_hook(module)
        del module._hf_hook
    if "_old_forward" in module.__dict__:
        old_forward = module.__dict__.pop("_old_forward")
        bound_to_class = getattr(old_forward, "__func__", None) is type(module).forward
        if bound_to_class:
            module.__dict__.pop("forward", None)
        else:
            module.forward = old_forward  # type: ignore[method-assign]
    for name in _ADDED_ATTRIBUTES:  # the move guards dispatch_model adds
        if getattr(module.__dict__.get(name), "_accel_guarded", False):
            del module.__dict__[name]
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of ``module`` and of all its sub-modules."""
    remove_hook_from_module(module, recurse=True)


class AlignDevicesHook(ModelHook):
    """Run a module on ``execution_device``, optionally with its weights offloaded.

    Args:
        execution_device: Where the module runs (inputs and weights are moved there); ``None``
            leaves inputs where they are.
        offload: Keep the weights on the meta device between calls and take them from
            ``weights_map`` for each forward.
        io_same_device: Move the outputs back to the device of the first input tensor.
        weights_map: Name -> tensor of the offloaded weights (relative to the module).
        offload_buffers: Offload buffers too (else they are moved to ``execution_device``).
        place_submodules: Handle the tensors of sub-modules as well as the module's own.
        skip_keys: Keys of dict inputs that are not moved.
        tied_params_map: Accepted for compatibility.

    """

    def __init__(
        self,
        execution_device: Device | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, torch.Tensor] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | list[str] | None = None,
        tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
    ) -> None:
        del tied_params_map
        self.execution_device = (
            torch.device("cuda", execution_device)
            if isinstance(execution_device, int)
            else (torch.device(execution_device) if execution_device is not None else None)
        )
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.input_device: torch.device | None = None
        self.param_original_devices: dict[str, torch.device] = {}
        self.buffer_original_devices: dict[str, torch.device] = {}
        #: Where every tensor of the module (buffers included) was when an offloading hook
        #: attached, as Accelerate records it: PEFT reads it to tell a disk-offloaded layer
        #: (``meta``) from one kept in CPU memory.
        self.original_devices: dict[str, torch.device] = {}
        self.offloaded: list[str] = []

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules})"
        )

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Move the weights to the execution device, or to ``meta`` when offloading."""
        recurse = self.place_submodules
        if not self.offload:
            if self.execution_device is not None:
                for name, _ in named_module_tensors(module, recurse=recurse):
                    set_module_tensor_to_device(module, name, self.execution_device)
            return module
        self.original_devices = {
            name: tensor.device for name, tensor in named_module_tensors(module, recurse=recurse)
        }
        # Buffers a state dict leaves out (non-persistent) are never offloaded, even with
        # offload_buffers: no weights file holds them. They go to the execution device instead.
        tensors = list(
            named_module_tensors(
                module,
                include_buffers=self.offload_buffers,
                recurse=recurse,
                remove_non_persistent=True,
            )
        )
        self.param_original_devices = {name: t.device for name, t in tensors}
        if self.weights_map is None:
            self.weights_map = {name: t.detach().to("cpu") for name, t in tensors}
        for name, _ in tensors:
            set_module_tensor_to_device(module, name, "meta")
        self.offloaded = [name for name, _ in tensors]
        if self.execution_device is not None:
            offloaded = set(self.offloaded)
            for name, buffer in module.named_buffers(recurse=recurse):
                if name not in offloaded:
                    self.buffer_original_devices[name] = buffer.device
                    set_module_tensor_to_device(module, name, self.execution_device)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Bring offloaded weights in and move the inputs to the execution device."""
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload and self.weights_map is not None:
            device = self.execution_device or torch.device("cpu")
            for name in self.offloaded:
                set_module_tensor_to_device(module, name, device, value=self.weights_map[name])
        if self.execution_device is None:
            return args, kwargs
        return (
            send_to_device(args, self.execution_device),
            send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys),
        )

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Release offloaded weights and move outputs back when ``io_same_device``."""
        if self.offload:
            for name in self.offloaded:
                set_module_tensor_to_device(module, name, "meta")
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Put offloaded weights back on their original devices."""
        if self.offload and self.weights_map is not None:
            for name in self.offloaded:
                device = self.param_original_devices.get(name, torch.device("cpu"))
                if device.type == "meta":
                    device = torch.device("cpu")
                set_module_tensor_to_device(module, name, device, value=self.weights_map[name])
            for name, device in self.buffer_original_devices.items():
                set_module_tensor_to_device(module, name, device)
        return module


def leaf_hooks(hook: ModelHook | None) -> list[ModelHook]:
    """The hooks inside ``hook``: itself, or those of a SequentialHook, nested ones flattened."""
    if hook is None:
        return []
    if isinstance(hook, SequentialHook):
        return [leaf for inner in hook.hooks for leaf in leaf_hooks(inner)]
    return [hook]


def offloading_hook(module: nn.Module) -> AlignDevicesHook | None:
    """The hook that brings ``module``'s own offloaded weights in, wherever it sits in its chain."""
    for hook in leaf_hooks(getattr(module, "_hf_hook", None)):
        if isinstance(hook, AlignDevicesHook) and hook.offload:
            return hook
    return None


def attach_align_device_hook(
    module: nn.Module,
    execution_device: Device | None = None,
    offload: bool = False,
    weights_map: Mapping[str, torch.Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: Iterable[str] | None = None,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
) -> None:
    """Attach an :class:`AlignDevicesHook` to every sub-module that holds tensors of its own.

    Each hooked module brings in only its own weights, so at most one layer's weights are on the
    execution device at a time. Modules whose class is in ``preload_module_classes`` load all
    their sub-modules' weights at once (for modules that use a child's weight directly).
    """
    del tied_params_map
    preload = set(preload_module_classes or [])
    whole = type(module).__name__ in preload
    # Buffers count even when they stay put: the hook moves them to the execution device.
    own = list(named_module_tensors(module, include_buffers=True, recurse=whole))
    if own or whole:
        prefix = f"{module_name}." if module_name else ""
        hook = AlignDevicesHook(
            execution_device=execution_device,
            offload=offload,
            weights_map=PrefixedDataset(weights_map, prefix) if weights_map is not None else None,
            offload_buffers=offload_buffers,
            place_submodules=whole,
            skip_keys=skip_keys,
        )
        add_hook_to_module(module, hook, append=True)
    if whole:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(
            child,
            execution_device=execution_device,
            offload=offload,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=f"{module_name}.{child_name}" if module_name else child_name,
            skip_keys=skip_keys,
            preload_module_classes=preload,
        )


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: Device,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: Iterable[str] | None = None,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
) -> None:
    """Make ``module`` and its sub-modules move their inputs to ``execution_device``.

    Every module without a hook that has tensors in its state dict gets an
    :class:`AlignDevicesHook`; the walk stops below modules of ``preload_module_classes``.
    """
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(
            module,
            AlignDevicesHook(
                execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map
            ),
        )
    preload = set(preload_module_classes or [])
    if type(module).__name__ in preload:
        return
    for child in module.children():
        attach_execution_device_hook(
            child,
            execution_device,
            skip_keys=skip_keys,
            preload_module_classes=preload,
            tied_params_map=tied_params_map,
        )


def attach_align_device_hook_on_blocks(
    module: nn.Module,
    execution_device: Device | Mapping[str, Device | None] | None = None,
    offload: bool | Mapping[str, bool] = False,
    weights_map: Mapping[str, torch.Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: Iterable[str] | None = None,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
) -> None:
    """Attach :class:`AlignDevicesHook` to the blocks of a model, per block device and offload.

    Args:
        module: The model (or block).
        execution_device: One device, or block name -> device.
        offload: One flag, or block name -> whether that block's weights are offloaded.
        weights_map: The offloaded weights by full tensor name.
        offload_buffers: Offload buffers too.
        module_name: ``module``'s name in the model.
        skip_keys: Input keys not moved between devices.
        preload_module_classes: Classes whose sub-module weights load all at once.
        tied_params_map: Accepted for compatibility.
    """
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if not offload:
            add_hook_to_module(
                module,
                AlignDevicesHook(
                    execution_device=execution_device,
                    io_same_device=True,
                    skip_keys=skip_keys,
                    place_submodules=True,
                ),
            )
        else:
            attach_align_device_hook(
                module,
                execution_device=execution_device,
                offload=True,
                weights_map=weights_map,
                offload_buffers=offload_buffers,
                module_name=module_name,
                skip_keys=skip_keys,
            )
        return
    devices: Mapping[str, Device | None] = (
        execution_device
        if isinstance(execution_device, Mapping)
        else dict.fromkeys(offload, execution_device)  # type: ignore[arg-type]
    )
    flags: Mapping[str, bool] = (
        offload if isinstance(offload, Mapping) else dict.fromkeys(devices, offload)
    )
    if module_name in devices and module_name in flags:
        device = devices[module_name]
        if not flags[module_name]:
            add_hook_to_module(
                module,
                AlignDevicesHook(
                    execution_device=device,
                    offload_buffers=offload_buffers,
                    io_same_device=module_name == "",
                    place_submodules=True,
                    skip_keys=skip_keys,
                ),
            )
        else:
            attach_align_device_hook(
                module,
                execution_device=device,
                offload=True,
                weights_map=weights_map,
                offload_buffers=offload_buffers,
                module_name=module_name,
                skip_keys=skip_keys,
                preload_module_classes=preload_module_classes,
            )
            if not hasattr(module, "_hf_hook"):
                add_hook_to_module(
                    module,
                    AlignDevicesHook(
                        execution_device=device,
                        io_same_device=module_name == "",
                        skip_keys=skip_keys,
                    ),
                )
        if device is not None:
            attach_execution_device_hook(
                module, device, skip_keys=skip_keys, preload_module_classes=preload_module_classes
            )
    elif module_name == "":
        add_hook_to_module(
            module,
            AlignDevicesHook(
                execution_device=devices.get(""), io_same_device=True, skip_keys=skip_keys
            ),
        )
    for child_name, child in module.named_children():
        attach_align_device_hook_on_blocks(
            child,
            execution_device=devices,
            offload=flags,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=f"{module_name}.{child_name}" if module_name else child_name,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
        )


class CpuOffload(ModelHook):
    """Keep a whole model on the CPU and move it to ``execution_device`` when it is called.

    It stays there until :meth:`UserCpuOffloadHook.offload` (or the next model in a pipeline,
    through ``prev_module_hook``) sends it back.
    """

    def __init__(
        self,
        execution_device: Device | None = None,
        prev_module_hook: UserCpuOffloadHook | None = None,
    ) -> None:
        if execution_device is None:
            execution_device = "cuda" if torch.cuda.is_available() else "cpu"
        self.execution_device = (
            torch.device("cuda", execution_device)
            if isinstance(execution_device, int)
            else torch.device(execution_device)
        )
        self.prev_module_hook = prev_module_hook

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Send the model to the CPU."""
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Offload the previous model, bring this one and its inputs to the execution device."""
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(
            kwargs, self.execution_device
        )


class UserCpuOffloadHook:
    """Handle returned by ``cpu_offload_with_hook``: ``offload()`` and ``remove()``."""

    def __init__(self, model: nn.Module, hook: CpuOffload) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        """Send the model back to the CPU."""
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        """Remove the hook from the model."""
        remove_hook_from_module(self.model)
