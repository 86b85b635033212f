"""Apply a function over nested containers of tensors, keeping every container's type.

Containers are lists, tuples, namedtuples (and ``torch.return_types``), any ``Mapping`` and
dataclass instances; everything else is a leaf.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeGuard

import torch

from accel_ops.errors import UnsupportedTypeError

TestType = Callable[[Any], bool]


def is_torch_tensor(tensor: Any) -> TypeGuard[torch.Tensor]:
    """Whether ``tensor`` is a ``torch.Tensor`` (subclasses included)."""
    return isinstance(tensor, torch.Tensor)


def is_namedtuple(data: Any) -> bool:
    """Whether ``data`` is an instance of a ``collections.namedtuple`` / ``typing.NamedTuple``."""
    fields = getattr(data, "_fields", None)
    return isinstance(data, tuple) and isinstance(fields, tuple)


def is_dataclass_instance(data: Any) -> bool:
    """Whether ``data`` is a dataclass instance (not a dataclass type)."""
    return dataclasses.is_dataclass(data) and not isinstance(data, type)


@dataclasses.dataclass(frozen=True)
class TensorInformation:
    """Shape and dtype of a tensor, enough to allocate a receiving buffer for it."""

    shape: torch.Size
    dtype: torch.dtype


def is_tensor_information(tensor_info: Any) -> TypeGuard[TensorInformation]:
    """Whether ``tensor_info`` is a :class:`TensorInformation`."""
    return isinstance(tensor_info, TensorInformation)


def honor_type(obj: Any, generator: Iterable[Any]) -> Any:
    """Build a sequence of ``obj``'s type (namedtuples included) from ``generator``.

    Args:
        obj: The list, tuple or namedtuple whose type to keep.
        generator: The new items, in order.

    """
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def rebuild_mapping(data: Mapping[Any, Any], items: dict[Any, Any]) -> Mapping[Any, Any]:
    """Build a mapping of ``data``'s type holding ``items``.

    Raises:
        UnsupportedTypeError: The mapping type can neither be built from a dict nor copied.

    """
    if isinstance(data, collections.defaultdict):
        return type(data)(data.default_factory, items)
    try:
        return type(data)(items)  # type: ignore[call-arg]
    except TypeError:
        # dict and UserDict subclasses copy into fresh storage, so updating the copy is safe.
        if isinstance(data, (dict, collections.UserDict)):
            rebuilt = copy.copy(data)
            rebuilt.update(items)
            return rebuilt
        raise UnsupportedTypeError(
            "rebuilding a mapping",
            type(data),
            "Mapping types that can be built from a dict",
            "Give the type a constructor that accepts a dict, or pass a plain dict.",
        ) from None


def rebuild_dataclass(data: Any, values: dict[str, Any]) -> Any:
    """Shallow-copy dataclass instance ``data`` with its fields set to ``values``.

    ``__init__`` and ``__post_init__`` are not run again, so frozen and ``init=False`` fields work.
    """
    rebuilt = copy.copy(data)
    for name, value in values.items():
        object.__setattr__(rebuilt, name, value)
    return rebuilt


def sequence_key(data: Any, index: int) -> str:
    """How item ``index`` of list/tuple ``data`` is written in a path (``[0]`` or ``.field``)."""
    if is_namedtuple(data):
        return f".{data._fields[index]}"
    return f"[{index}]"


def _apply(
    func: Callable[..., Any],
    data: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    test_type: TestType,
    error_on_other_type: bool,
) -> Any:
    cls = type(data)
    if cls is torch.Tensor:  # the common leaf: skip the container checks
        if test_type is is_torch_tensor or test_type(data):
            return func(data, *args, **kwargs)
    elif cls is list or cls is tuple or isinstance(data, (list, tuple)):
        items = []
        for index, item in enumerate(data):
            try:
                items.append(_apply(func, item, args, kwargs, test_type, error_on_other_type))
            except UnsupportedTypeError as error:
                error.path.insert(0, sequence_key(data, index))
                raise
        return items if cls is list else honor_type(data, items)
    elif cls is dict or isinstance(data, Mapping):
        mapped = {}
        for key, value in data.items():
            try:
                mapped[key] = _apply(func, value, args, kwargs, test_type, error_on_other_type)
            except UnsupportedTypeError as error:
                error.path.insert(0, f"[{key!r}]")
                raise
        return mapped if cls is dict else rebuild_mapping(data, mapped)
    if cls is not torch.Tensor and test_type(data):
        return func(data, *args, **kwargs)
    if is_dataclass_instance(data):
        values = {}
        for field in dataclasses.fields(data):
            try:
                values[field.name] = _apply(
                    func, getattr(data, field.name), args, kwargs, test_type, error_on_other_type
                )
            except UnsupportedTypeError as error:
                error.path.insert(0, f".{field.name}")
                raise
        return rebuild_dataclass(data, values)
    if error_on_other_type:
        raise UnsupportedTypeError(
            getattr(func, "__name__", repr(func)),
            type(data),
            "nested list/tuple/namedtuple/Mapping/dataclass containers whose leaves pass "
            f"{getattr(test_type, '__name__', repr(test_type))}",
        )
    return data


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: TestType = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Apply ``func(leaf, *args, **kwargs)`` to every leaf of ``data`` that passes ``test_type``.

    Containers keep their type: list, tuple, namedtuple, any Mapping and dataclass instances.

    Args:
        func: Function applied to each matching leaf.
        data: The nested structure.
        *args: Extra positional arguments for ``func``.
        test_type: Predicate selecting the leaves ``func`` applies to.
        error_on_other_type: Raise on leaves failing ``test_type`` instead of passing them through.
        **kwargs: Extra keyword arguments for ``func``.

    Returns:
        The same structure with ``func`` applied to the matching leaves.

    Raises:
        UnsupportedTypeError: A leaf fails ``test_type`` and ``error_on_other_type`` is set; the
            message gives its type and its path inside ``data``. It is a ``TypeError``.

    """
    return _apply(func, data, args, kwargs, test_type, error_on_other_type)


def apply_to_tensors(
    operation: str, hint: str, func: Callable[..., Any], data: Any, *args: Any, **kwargs: Any
) -> Any:
    """:func:`recursively_apply` that rejects non-tensor leaves with a message naming ``operation``.

    Raises:
        UnsupportedTypeError: A leaf is not a tensor; the message ends with ``hint``.

    """
    try:
        return _apply(func, data, args, kwargs, is_torch_tensor, True)
    except UnsupportedTypeError as error:
        error.operation = operation
        error.expected = "tensors nested in list/tuple/namedtuple/Mapping/dataclass containers"
        error.hint = hint
        raise


def named_leaves(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every leaf of ``data`` with its path (``['key'][0].field``), in the order others visit them."""
    leaves: list[tuple[str, Any]] = []
    _collect(data, prefix, leaves)
    return leaves


def _collect(data: Any, path: str, leaves: list[tuple[str, Any]]) -> None:
    if isinstance(data, torch.Tensor):
        leaves.append((path, data))
    elif isinstance(data, (list, tuple)):
        for index, item in enumerate(data):
            _collect(item, path + sequence_key(data, index), leaves)
    elif isinstance(data, Mapping):
        for key, value in data.items():
            _collect(value, f"{path}[{key!r}]", leaves)
    elif is_dataclass_instance(data):
        for field in dataclasses.fields(data):
            _collect(getattr(data, field.name), f"{path}.{field.name}", leaves)
    else:
        leaves.append((path, data))


def get_data_structure(data: Any) -> Any:
    """Replace every tensor in ``data`` by its :class:`TensorInformation` (shape and dtype)."""
    return recursively_apply(_tensor_information, data)


def _tensor_information(tensor: torch.Tensor) -> TensorInformation:
    return TensorInformation(shape=tensor.shape, dtype=tensor.dtype)


def get_shape(data: Any) -> Any:
    """Replace every tensor in ``data`` by its shape as a list of ints."""
    return recursively_apply(_shape_list, data)


def _shape_list(tensor: torch.Tensor) -> list[int]:
    return list(tensor.shape)


def initialize_tensors(data_structure: Any, device: torch.device | str | None = None) -> Any:
    """Allocate an uninitialised tensor for every :class:`TensorInformation` in ``data_structure``.

    Args:
        data_structure: Output of :func:`get_data_structure`.
        device: Where to allocate (default: the CPU).

    """
    return recursively_apply(
        _empty_from_information, data_structure, device, test_type=is_tensor_information
    )


def _empty_from_information(
    information: TensorInformation, device: torch.device | str | None
) -> torch.Tensor:
    return torch.empty(information.shape, dtype=information.dtype, device=device)
