"""8-bit and 4-bit models through bitsandbytes: quantize while loading, plan, offload.

:func:`load_and_quantize_model` swaps a (usually empty, ``init_empty_weights``) model's
``nn.Linear`` layers for bitsandbytes' ``Linear8bitLt`` / ``Linear4bit``, plans a device map
with the quantized sizes, then reads the checkpoint one tensor at a time, quantizing each weight
as it arrives: the fp32 model never exists in memory, so the peak stays near the quantized
size. Planned units that do not fit go to the disk (or, with a GPU, stay in CPU memory) already
quantized, and a hook rebuilds them on the execution device for each forward.

bitsandbytes runs its 8-bit and 4-bit layers on the CPU as well as on GPUs; it is imported only
here, when a model is quantized (``pip install 'accel-ckpt[bnb]'``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_ckpt.big_modeling.empty_init import init_empty_weights
from accel_ckpt.big_modeling.hooks import AlignDevicesHook, ModelHook, add_hook_to_module
from accel_ckpt.big_modeling.memory import CPU, DISK, DeviceKey, normalize_device_key
from accel_ckpt.big_modeling.planning import main_device_of
from accel_ckpt.big_modeling.strategies import plan_device_map
from accel_ckpt.big_modeling.tensors import find_tied_parameters, named_module_tensors
from accel_ckpt.dtypes import CustomDtype
from accel_ckpt.errors import InvalidArgumentError, StateDictMismatchError, format_keys
from accel_ckpt.memory import release_free_heap
from accel_ckpt.model_loading import resolve_model_checkpoint
from accel_ckpt.safetensors_io import iter_safetensors

# Accelerate logs from ``accelerate.utils.bnb``; accel's twin of that name.
logger = logging.getLogger("accel.utils.bnb")

PathLike = str | os.PathLike[str]
BNB_INSTALL = "pip install 'accel-ckpt[bnb]' (or pip install bitsandbytes)"
_COMPUTE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _dtype_argument(name: str, value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value in _COMPUTE_DTYPES:
        return _COMPUTE_DTYPES[value]
    raise InvalidArgumentError(
        f"BnbQuantizationConfig({name}={value!r}): use 'fp32', 'fp16', 'bf16' or a torch.dtype."
    )


@dataclasses.dataclass
class BnbQuantizationConfig:
    """How :func:`load_and_quantize_model` quantizes (Accelerate's fields).

    Args:
        load_in_8bit: LLM.int8() 8-bit linear layers (``Linear8bitLt``).
        llm_int8_threshold: Outlier threshold of the 8-bit matmul (inputs above it are computed
            in 16/32-bit); 8-bit only.
        load_in_4bit: 4-bit linear layers (``Linear4bit``).
        bnb_4bit_quant_type: ``"fp4"`` or ``"nf4"``.
        bnb_4bit_use_double_quant: Quantize the quantization constants too.
        bnb_4bit_compute_dtype: Dtype of the 4-bit matmuls: ``"fp32"``, ``"fp16"``, ``"bf16"``
            or a ``torch.dtype``.
        torch_dtype: Dtype of the layers left unquantized (``None``: as in the checkpoint).
        skip_modules: Modules left unquantized, at ``torch_dtype`` (default: the model's last
            child, e.g. an LM head, and tied weights). Names match whole dotted components.
        keep_in_fp32_modules: Modules left unquantized, in float32.

    Raises:
        InvalidArgumentError: Neither or both of 8-bit and 4-bit, or a value out of range.
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None

    def __post_init__(self) -> None:
        for name in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(
                    f"BnbQuantizationConfig({name}={getattr(self, name)!r}) must be True or False."
                )
        if self.load_in_8bit == self.load_in_4bit:
            raise InvalidArgumentError(
                "BnbQuantizationConfig needs exactly one of load_in_8bit=True or "
                f"load_in_4bit=True (got load_in_8bit={self.load_in_8bit}, "
                f"load_in_4bit={self.load_in_4bit})."
            )
        if isinstance(self.llm_int8_threshold, bool) or not isinstance(
            self.llm_int8_threshold, (int, float)
        ):
            raise InvalidArgumentError(
                f"BnbQuantizationConfig(llm_int8_threshold={self.llm_int8_threshold!r}) must be "
                "a number."
            )
        if self.bnb_4bit_quant_type not in ("fp4", "nf4"):
            raise InvalidArgumentError(
                f"BnbQuantizationConfig(bnb_4bit_quant_type={self.bnb_4bit_quant_type!r}): use "
                "'fp4' or 'nf4'."
            )
        self.bnb_4bit_compute_dtype = _dtype_argument(
            "bnb_4bit_compute_dtype", self.bnb_4bit_compute_dtype
        )
        self.torch_dtype = _dtype_argument("torch_dtype", self.torch_dtype)
        for name in ("skip_modules", "keep_in_fp32_modules"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(v, str) for v in value)
            ):
                raise InvalidArgumentError(
                    f"BnbQuantizationConfig({name}={value!r}) must be a list of module names."
                )

    @property
    def target_dtype(self) -> torch.dtype | CustomDtype:
        """What a quantized weight is stored as: ``torch.int8`` or ``CustomDtype.INT4``."""
        return torch.int8 if self.load_in_8bit else CustomDtype.INT4


def _bnb() -> Any:
    try:
        import bitsandbytes
    except ImportError:
        raise InvalidArgumentError(
            f"8-bit and 4-bit models need bitsandbytes, which is not installed: {BNB_INSTALL}."
        ) from None
    return bitsandbytes


def _matches(name: str, module: str) -> bool:
    """``name`` is ``module`` or lies inside it (whole dotted components)."""
    return name == module or f".{module}." in f".{name}."


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds bitsandbytes ``Linear4bit`` layers."""
    if not any(type(m).__module__.startswith("bitsandbytes") for m in model.modules()):
        return False
    bnb = _bnb()
    return any(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())


def has_8bit_bnb_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds bitsandbytes ``Linear8bitLt`` layers."""
    if not any(type(m).__module__.startswith("bitsandbytes") for m in model.modules()):
        return False
    bnb = _bnb()
    return any(isinstance(module, bnb.nn.Linear8bitLt) for module in model.modules())


def get_keys_to_not_convert(model: nn.Module) -> list[str]:
    """Modules kept unquantized by default: the last child (a head) and tied weights' modules."""
    tied = [name for group in find_tied_parameters(model) for name in group]
    children = [name for name, _ in model.named_children()]
    names = {*(name.rsplit(".", 1)[0] for name in tied), *children[-1:]}
    return sorted(names)


def _quantized_layer(
    bnb: Any, config: BnbQuantizationConfig, linear: nn.Linear, device: torch.device | str = "meta"
) -> nn.Module:
    bias = linear.bias is not None
    if config.load_in_8bit:
        return bnb.nn.Linear8bitLt(  # type: ignore[no-any-return]
            linear.in_features,
            linear.out_features,
            bias,
            has_fp16_weights=False,
            threshold=float(config.llm_int8_threshold),
            device=device,
        )
    return bnb.nn.Linear4bit(  # type: ignore[no-any-return]
        linear.in_features,
        linear.out_features,
        bias,
        compute_dtype=config.bnb_4bit_compute_dtype,
        compress_statistics=config.bnb_4bit_use_double_quant,
        quant_type=config.bnb_4bit_quant_type,
        device=device,
    )


def _linears_to_convert(
    model: nn.Module, modules_to_not_convert: list[str], prefix: str = ""
) -> list[tuple[nn.Module, str, str]]:
    """``(parent, attribute, name in model)`` of each ``nn.Linear`` to quantize.

    A layer is kept when its full name (``prefix`` + its name in ``model``) is one of
    ``modules_to_not_convert`` or lies inside one (whole dotted components).
    """
    found = []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            full = f"{prefix}.{name}" if prefix else name
            if type(child) is not nn.Linear:
                continue
            if any(_matches(full, skip) for skip in modules_to_not_convert):
                continue
            found.append((parent, child_name, name))
    return found


def _warn_nothing_replaced(model: nn.Module) -> None:
    logger.warning(
        "load_and_quantize_model: %s has no nn.Linear layer to quantize.", type(model).__name__
    )


def _replace_linear_layers(
    model: nn.Module, config: BnbQuantizationConfig, modules_to_not_convert: list[str]
) -> list[str]:
    """Swap every ``nn.Linear`` outside ``modules_to_not_convert`` for an empty (meta) layer.

    Returns:
        The names of the replaced layers.
    """
    bnb = _bnb()
    found = _linears_to_convert(model, modules_to_not_convert)
    for parent, attribute, _ in found:
        setattr(parent, attribute, _quantized_layer(bnb, config, getattr(parent, attribute)))
    if not found:
        _warn_nothing_replaced(model)
    return [name for _, _, name in found]


def replace_with_bnb_layers(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    modules_to_not_convert: list[str] | None = None,
    current_key_name: list[str] | None = None,
) -> nn.Module:
    """Swap every ``nn.Linear`` outside ``modules_to_not_convert`` for a bitsandbytes layer.

    As in Accelerate, each new ``Linear8bitLt``/``Linear4bit`` (per ``load_in_8bit`` /
    ``load_in_4bit``) holds the replaced layer's weight and bias, not yet quantized
    (bitsandbytes quantizes when the layer moves to its device), and does not require grad.

    Args:
        model: The model (or a submodule of a larger one), changed in place.
        bnb_quantization_config: Which layer type and its settings.
        modules_to_not_convert: Module names kept in full precision, matched against each
            layer's full name and its parents (``"lm_head"`` keeps ``lm_head`` and everything in
            it). ``None``: none.
        current_key_name: Where ``model`` sits inside a larger model, as name components
            (``["model", "decoder"]``), so that names there match ``modules_to_not_convert``.

    Returns:
        ``model``.

    Raises:
        InvalidArgumentError: bitsandbytes is not installed.
    """
    bnb = _bnb()
    prefix = ".".join(current_key_name or [])
    found = _linears_to_convert(model, list(modules_to_not_convert or []), prefix)
    for parent, attribute, _ in found:
        linear = getattr(parent, attribute)
        layer = _quantized_layer(bnb, bnb_quantization_config, linear, linear.weight.device)
        layer.weight.data = linear.weight.data
        if linear.bias is not None:
            layer.bias.data = linear.bias.data
        layer.requires_grad_(False)
        setattr(parent, attribute, layer)
    if not found:
        _warn_nothing_replaced(model)
    return model


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """The device of ``parameter``'s first parameter (Accelerate's helper).

    Raises:
        ValueError: The module has no parameters.
    """
    for tensor in parameter.parameters():
        return tensor.device
    raise ValueError(
        f"get_parameter_device: {type(parameter).__name__} has no parameters, so no device; "
        "pass a module that holds at least one parameter."
    )


def _device(key: DeviceKey) -> torch.device:
    if isinstance(key, int):
        return torch.device("cuda", key)
    return torch.device(key)


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    module_name, _, leaf = name.rpartition(".")
    return (model.get_submodule(module_name) if module_name else model), leaf


def _device_of(name: str, plan: Mapping[str, DeviceKey]) -> tuple[str, DeviceKey]:
    best, length = None, -1
    for key in plan:
        if (key == "" or name == key or name.startswith(key + ".")) and len(key) > length:
            best, length = key, len(key)
    if best is None:
        raise InvalidArgumentError(f"device_map has no entry for {name!r}.")
    return best, plan[best]


class _Quantizer:
    """Turns checkpoint tensors into the quantized model's tensors, one at a time."""

    def __init__(
        self,
        model: nn.Module,
        config: BnbQuantizationConfig,
        quantized: set[str],
        keep_in_fp32: list[str],
    ) -> None:
        self.bnb = _bnb()
        self.model = model
        self.config = config
        self.quantized_weights = {f"{name}.weight" for name in quantized}
        self.keep_in_fp32 = keep_in_fp32

    def dtype_for(self, name: str, value: torch.Tensor) -> torch.dtype:
        if not value.is_floating_point():
            return value.dtype
        if any(_matches(name, keep) for keep in self.keep_in_fp32):
            return torch.float32
        return self.config.torch_dtype or value.dtype

    def quantize(self, name: str, value: torch.Tensor, device: torch.device) -> nn.Parameter:
        """A bitsandbytes parameter holding ``value`` quantized on ``device``."""
        layer, _ = _owner(self.model, name)
        data = value.to(
            torch.float32 if self.config.torch_dtype is None else self.config.torch_dtype
        )
        if self.config.load_in_8bit:
            parameter = self.bnb.nn.Int8Params(data, requires_grad=False, has_fp16_weights=False)
        else:
            parameter = self.bnb.nn.Params4bit(
                data,
                requires_grad=False,
                quant_type=self.config.bnb_4bit_quant_type,
                compress_statistics=self.config.bnb_4bit_use_double_quant,
                module=layer,
            )
        return parameter.to(device)  # type: ignore[no-any-return]

    def quantized_state(self, name: str, parameter: nn.Parameter) -> dict[str, torch.Tensor]:
        """The tensors that rebuild ``parameter`` (weight data and quantization statistics)."""
        state = {name: parameter.data}
        if self.config.load_in_8bit:
            state[name.removesuffix("weight") + "SCB"] = parameter.SCB  # type: ignore[attr-defined]
        else:
            stats = parameter.quant_state.as_dict(packed=True)  # type: ignore[attr-defined]
            state.update({f"{name}.{key}": tensor for key, tensor in stats.items()})
        return state

    def rebuild(
        self, name: str, state: Mapping[str, torch.Tensor], device: torch.device
    ) -> nn.Parameter:
        """The bitsandbytes parameter ``name`` from :meth:`quantized_state`'s tensors."""
        data = state[name].to(device)
        if self.config.load_in_8bit:
            parameter = self.bnb.nn.Int8Params(data, requires_grad=False, has_fp16_weights=False)
            parameter.CB = parameter.data
            parameter.SCB = state[name.removesuffix("weight") + "SCB"].to(device)
            return parameter  # type: ignore[no-any-return]
        prefix = f"{name}."
        stats = {
            key.removeprefix(prefix): t.to(device)
            for key, t in state.items()
            if key.startswith(prefix)
        }
        layer, _ = _owner(self.model, name)
        return self.bnb.nn.Params4bit.from_prequantized(  # type: ignore[no-any-return]
            data, stats, requires_grad=False, device=device, module=layer
        )


def _set(model: nn.Module, name: str, value: torch.Tensor) -> None:
    module, leaf = _owner(model, name)
    if leaf in module._parameters:
        old = module._parameters[leaf]
        if not isinstance(value, nn.Parameter):
            value = nn.Parameter(value, requires_grad=bool(old is not None and old.requires_grad))
        module._parameters[leaf] = value
    else:
        module._buffers[leaf] = value


def _get(model: nn.Module, name: str) -> torch.Tensor:
    module, leaf = _owner(model, name)
    current = module._parameters.get(leaf, module._buffers.get(leaf))
    assert current is not None
    return current


class QuantizedOffloadHook(ModelHook):
    """Keeps an offloaded unit's (quantized) tensors off its module between forwards.

    Before each forward the unit's tensors are read (from its safetensors file on disk, or
    from CPU memory), quantized weights rebuilt on ``execution_device``, and the inputs moved
    there; after it, the tensors are dropped again (back to ``meta``).
    """

    def __init__(
        self,
        quantizer: _Quantizer,
        unit: str,
        names: list[str],
        execution_device: torch.device,
        storage: Path | dict[str, torch.Tensor],
        aliases: Mapping[str, list[str]] | None = None,
    ) -> None:
        self.quantizer = quantizer
        self.unit = unit
        self.names = names
        self.aliases = {name: list(aliases.get(name, [])) for name in names} if aliases else {}
        self.execution_device = execution_device
        self.storage = storage

    def _state(self) -> Mapping[str, torch.Tensor]:
        if isinstance(self.storage, Path):
            return {name: tensor for name, tensor, _ in iter_safetensors(self.storage)}
        return self.storage

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Bring the unit's tensors in and move the inputs to the execution device."""
        from accel_ops import send_to_device

        state = self._state()
        model = self.quantizer.model
        for name in self.names:
            if name in self.quantizer.quantized_weights:
                _set(model, name, self.quantizer.rebuild(name, state, self.execution_device))
            else:
                _set(model, name, state[name].to(self.execution_device))
            for alias in self.aliases.get(name, []):
                _set(model, alias, _get(model, name))
        return send_to_device(args, self.execution_device), send_to_device(
            kwargs, self.execution_device
        )

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Drop the unit's tensors (they stay in the offload storage)."""
        model = self.quantizer.model
        for name in self.names:
            current = _get(model, name)
            _set(model, name, torch.empty(current.shape, dtype=current.dtype, device="meta"))
            for alias in self.aliases.get(name, []):
                _set(model, alias, _get(model, name))
        return output


def _sizing_dtypes(
    model: nn.Module,
    config: BnbQuantizationConfig,
    quantized: set[str],
    keep_in_fp32: list[str],
) -> dict[str, Any]:
    """Per-parameter dtypes the planner sizes with: quantized weights at the quantized size."""
    special: dict[str, Any] = {}
    for name, _ in model.named_parameters():
        owner = name.rpartition(".")[0]
        if owner in quantized and name.endswith(".weight"):
            special[name] = config.target_dtype
        elif any(_matches(name, keep) for keep in keep_in_fp32):
            special[name] = torch.float32
        elif config.torch_dtype is not None:
            special[name] = config.torch_dtype
    return special


def _plan(
    model: nn.Module,
    config: BnbQuantizationConfig,
    device_map: str | Mapping[str, int | str | torch.device] | None,
    max_memory: Mapping[object, int | str] | None,
    no_split_module_classes: list[str] | None,
    quantized: set[str],
    keep_in_fp32: list[str],
) -> dict[str, DeviceKey]:
    """The device map: everything on the first GPU (else the CPU) for ``None``, else planned."""
    if device_map is None:
        return {"": 0 if torch.cuda.is_available() else CPU}
    return plan_device_map(
        model,
        device_map,
        max_memory=max_memory,
        no_split_module_classes=no_split_module_classes,
        special_dtypes=_sizing_dtypes(model, config, quantized, keep_in_fp32),
        strict_keys=False,
    )


def get_quantized_model_device_map(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    device_map: str | Mapping[str, int | str | torch.device] | None = None,
    max_memory: Mapping[object, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
) -> dict[str, DeviceKey]:
    """The device map :func:`load_and_quantize_model` would use for ``model`` (Accelerate's step).

    A planning strategy (``"auto"``, ``"balanced"``, ``"balanced_low_0"``, ``"sequential"``)
    counts the quantized linear weights at the quantized size (bitsandbytes layers already in
    ``model``, or the ``nn.Linear`` layers outside ``skip_modules``/``keep_in_fp32_modules`` that
    :func:`load_and_quantize_model` would convert), ``keep_in_fp32_modules`` in float32 and the
    rest in ``torch_dtype``. A dict is checked against the model and returned normalized;
    ``None`` puts everything on the first GPU, else on the CPU (Accelerate requires a GPU; accel
    quantizes on the CPU too, and offloads 4-bit layers where Accelerate refuses).

    Raises:
        DeviceMapError: (an ``InvalidArgumentError``) An unknown strategy, a dict that leaves
            tensors unplaced or names an unknown device, or a GPU that is not visible.
    """
    config = bnb_quantization_config
    skip = list(config.skip_modules) if config.skip_modules is not None else None
    if skip is None:
        skip = get_keys_to_not_convert(model)
    keep_in_fp32 = list(config.keep_in_fp32_modules or [])
    quantized = {
        name
        for name, module in model.named_modules()
        if type(module).__name__ in ("Linear8bitLt", "Linear4bit")
        and type(module).__module__.startswith("bitsandbytes")
    }
    quantized.update(name for _, _, name in _linears_to_convert(model, skip + keep_in_fp32))
    return _plan(
        model, config, device_map, max_memory, no_split_module_classes, quantized, keep_in_fp32
    )


def load_and_quantize_model(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: PathLike | None = None,
    device_map: str | Mapping[str, int | str | torch.device] | None = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: Mapping[object, int | str] | None = None,
    offload_folder: PathLike | None = None,
    offload_state_dict: bool = False,
) -> nn.Module:
    """Quantize ``model``'s linear layers to 8 or 4 bits with bitsandbytes, loading its weights.

    Example:
        >>> with init_empty_weights():
        ...     model = MyModel()
        >>> config = BnbQuantizationConfig(load_in_8bit=True)
        >>> model = load_and_quantize_model(model, config, "checkpoint_folder",
        ...     device_map="auto", max_memory={"cpu": "2GiB"}, offload_folder="offload")

    Args:
        model: The model, built under :func:`init_empty_weights` (or already loaded, then
            ``weights_location`` may be ``None`` and it is quantized in place).
        bnb_quantization_config: How to quantize.
        weights_location: A safetensors file, a ``*.index.json`` of shards, or their folder.
        device_map: A dict of module name -> device (``"cpu"``, a GPU index, ``"disk"``), a
            planning strategy (``"auto"``, ``"balanced"``, ``"balanced_low_0"``,
            ``"sequential"``; sizes are counted quantized), or ``None``: everything on the first
            GPU, else the CPU.
        no_split_module_classes: Blocks that must stay on one device.
        max_memory: Budget per device for the planning strategies.
        offload_folder: Where units planned for ``"disk"`` are written (already quantized).
        offload_state_dict: Accepted for compatibility: tensors are always read one at a time.

    Returns:
        The quantized model (``hf_device_map`` holds the plan; ``is_loaded_in_8bit`` /
        ``is_loaded_in_4bit`` are set).

    Raises:
        InvalidArgumentError: bitsandbytes is missing, a disk plan without ``offload_folder``,
            or an empty model without ``weights_location``; its subclass ``DeviceMapError``
            for a bad device map or strategy.
        StateDictMismatchError: The checkpoint lacks weights the model needs, or shapes differ.
    """
    del offload_state_dict
    config = bnb_quantization_config
    skip = list(config.skip_modules) if config.skip_modules is not None else None
    if skip is None:
        skip = get_keys_to_not_convert(model)
    keep_in_fp32 = list(config.keep_in_fp32_modules or [])
    empty = any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])
    if not empty and weights_location is None:
        return _quantize_loaded(model, config, skip + keep_in_fp32, keep_in_fp32, device_map)
    if weights_location is None:
        raise InvalidArgumentError(
            "load_and_quantize_model: the model is empty (meta tensors) and weights_location is "
            "None; pass the checkpoint file or folder to load."
        )
    with init_empty_weights():
        quantized = set(_replace_linear_layers(model, config, skip + keep_in_fp32))
    plan = _plan(
        model, config, device_map, max_memory, no_split_module_classes, quantized, keep_in_fp32
    )
    if DISK in plan.values() and offload_folder is None:
        raise InvalidArgumentError(
            f"The plan sends {[k for k, v in plan.items() if v == DISK][:5]} to 'disk' but "
            "offload_folder is None; pass offload_folder='some/folder' or allow more memory."
        )
    plan = _expand_containers(model, plan)
    quantizer = _Quantizer(model, config, quantized, keep_in_fp32)
    _load(model, quantizer, weights_location, plan, offload_folder)
    model.hf_device_map = dict(plan)  # type: ignore[assignment]
    model.is_loaded_in_8bit = config.load_in_8bit  # type: ignore[assignment]
    model.is_loaded_in_4bit = config.load_in_4bit  # type: ignore[assignment]
    return model


def _expand_containers(model: nn.Module, plan: Mapping[str, DeviceKey]) -> dict[str, DeviceKey]:
    """The plan with ``ModuleList``/``ModuleDict`` entries replaced by their children.

    Containers are never called, so a hook on one would never bring its weights in.
    """
    expanded: dict[str, DeviceKey] = {}
    for key, device in plan.items():
        module = model.get_submodule(key) if _is_module(model, key) else None
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            children = _expand_containers(
                module, {name: device for name, _ in module.named_children()}
            )
            expanded.update({f"{key}.{name}": value for name, value in children.items()})
        else:
            expanded[key] = device
    return expanded


def _quantize_loaded(
    model: nn.Module,
    config: BnbQuantizationConfig,
    not_converted: list[str],
    keep_in_fp32: list[str],
    device_map: Any,
) -> nn.Module:
    """Quantize an already loaded model in place on one device."""
    logger.warning(
        "load_and_quantize_model: quantizing a loaded model holds it in full precision first; "
        "build it under init_empty_weights() and pass weights_location to load it quantized."
    )
    if isinstance(device_map, Mapping) and len(set(device_map.values())) == 1:
        (key,) = set(device_map.values())
        device = _device(normalize_device_key(key, "device_map"))
    elif device_map is None:
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device(CPU)
    else:
        raise InvalidArgumentError(
            "load_and_quantize_model(weights_location=None) quantizes a loaded model on one "
            "device; pass device_map={'': device} or None."
        )
    weights = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    quantized = set(_replace_linear_layers(model, config, not_converted))
    quantizer = _Quantizer(model, config, quantized, keep_in_fp32)
    for name, value in weights.items():
        if name in quantizer.quantized_weights:
            _set(model, name, quantizer.quantize(name, value, device))
        elif _has_tensor(model, name):
            _set(model, name, value.to(device=device, dtype=quantizer.dtype_for(name, value)))
    model.is_loaded_in_8bit = config.load_in_8bit  # type: ignore[assignment]
    model.is_loaded_in_4bit = config.load_in_4bit  # type: ignore[assignment]
    return model


def _has_tensor(model: nn.Module, name: str) -> bool:
    try:
        module, leaf = _owner(model, name)
    except AttributeError:
        return False
    return leaf in module._parameters or leaf in module._buffers


def _load(
    model: nn.Module,
    quantizer: _Quantizer,
    weights_location: PathLike,
    plan: Mapping[str, DeviceKey],
    offload_folder: PathLike | None,
) -> None:
    """Read the checkpoint tensor by tensor into the planned devices, quantizing weights."""
    main = main_device_of(plan)
    first = {id(p): name for name, p in model.named_parameters()}
    canonical = {name: first[id(p)] for name, p in model.named_parameters(remove_duplicate=False)}
    aliases: dict[str, list[str]] = {}
    for name, target in canonical.items():
        if name != target:
            aliases.setdefault(target, []).append(name)
    expected = {
        name for name, _ in named_module_tensors(model, recurse=True, remove_non_persistent=True)
    }
    units: dict[str, list[str]] = {}
    for name in expected:
        unit, device = _device_of(name, plan)
        if device == DISK or (device == CPU and main != CPU):
            units.setdefault(unit, []).append(name)
    pending: dict[str, dict[str, torch.Tensor]] = {unit: {} for unit in units}
    seen: set[str] = set()
    unexpected: list[str] = []
    source = resolve_model_checkpoint(weights_location)
    if not source.safetensors:
        raise InvalidArgumentError(
            f"load_and_quantize_model reads safetensors checkpoints; {weights_location} holds "
            "pickled .bin files. Save the model with save_model (safe_serialization=True)."
        )
    for path in source.files:
        for stored, value, _ in iter_safetensors(path):
            name = canonical.get(stored, stored)
            if name in seen:
                continue
            if name not in expected:
                unexpected.append(stored)
                continue
            seen.add(name)
            _check_shape(model, name, value, path)
            unit, device = _device_of(name, plan)
            offloaded = unit in units
            destination = _device(main if offloaded else device)
            if name in quantizer.quantized_weights:
                parameter = quantizer.quantize(name, value, destination)
                if offloaded:
                    pending[unit].update(quantizer.quantized_state(name, parameter))
                else:
                    _set(model, name, parameter)
            else:
                converted = value.to(device=destination, dtype=quantizer.dtype_for(name, value))
                if offloaded:
                    pending[unit][name] = converted
                else:
                    _set(model, name, converted)
                    for alias in aliases.get(name, []):
                        _set(model, alias, _get(model, name))
            del value
            release_free_heap()
            if offloaded and set(units[unit]) <= seen:
                _finish_unit(
                    aliases,
                    model,
                    quantizer,
                    unit,
                    units[unit],
                    pending.pop(unit),
                    plan,
                    main,
                    offload_folder,
                )
    missing = sorted(expected - seen)
    if missing:
        raise StateDictMismatchError(
            f"{weights_location} has no weights for {format_keys(missing)}; load the checkpoint "
            "saved from this model.",
            missing_keys=missing,
            unexpected_keys=unexpected,
        )
    if unexpected:
        logger.warning(
            "Some weights of %s were not used: %s", weights_location, format_keys(unexpected)
        )
    if len({_device(main), *(_device(v) for v in plan.values() if v != DISK)}) > 1:
        for key, placed in plan.items():
            if key not in units and placed != DISK and _is_module(model, key):
                add_hook_to_module(
                    model.get_submodule(key), AlignDevicesHook(_device(placed)), append=True
                )
        add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)


def _is_module(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def _check_shape(model: nn.Module, name: str, value: torch.Tensor, path: Path) -> None:
    current = _get(model, name)
    if tuple(current.shape) != tuple(value.shape):
        raise StateDictMismatchError(
            f"Cannot load {name!r}: {path} has shape {list(value.shape)}, the model "
            f"{list(current.shape)}. Load into a model built with the same configuration."
        )


def _finish_unit(
    aliases: Mapping[str, list[str]],
    model: nn.Module,
    quantizer: _Quantizer,
    unit: str,
    names: list[str],
    state: dict[str, torch.Tensor],
    plan: Mapping[str, DeviceKey],
    main: DeviceKey,
    offload_folder: PathLike | None,
) -> None:
    """Store a complete offloaded unit (disk file or CPU memory) and hook its module."""
    storage: Path | dict[str, torch.Tensor]
    if plan[unit] == DISK:
        assert offload_folder is not None
        from safetensors.torch import save_file

        folder = Path(offload_folder)
        folder.mkdir(parents=True, exist_ok=True)
        storage = folder / f"{unit or 'model'}.quantized.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(storage))
        state.clear()
    else:
        storage = state
    if not _is_module(model, unit):
        raise InvalidArgumentError(
            f"device_map offloads the tensor {unit!r} on its own; offload its module instead."
        )
    add_hook_to_module(
        model.get_submodule(unit),
        QuantizedOffloadHook(quantizer, unit, sorted(names), _device(main), storage, aliases),
        append=True,
    )


__all__ = [
    "BNB_INSTALL",
    "BnbQuantizationConfig",
    "CustomDtype",
    "QuantizedOffloadHook",
    "get_keys_to_not_convert",
    "has_4bit_bnb_layers",
    "has_8bit_bnb_layers",
    "load_and_quantize_model",
    "replace_with_bnb_layers",
    "get_parameter_device",
    "get_quantized_model_device_map",
]
