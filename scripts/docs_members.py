"""Which members of accel's public classes the API reference renders, for the generator and checker.

A public class is documented with every public method, property and attribute it has, those it
inherits from accel's own bases (the ``Accelerator`` is built from mixins) included; members
inherited from other libraries (``torch.nn.Module``, ``object``) are theirs to document.
"""

from __future__ import annotations

import inspect

#: The import names of accel's packages: bases from these are ours to document.
OUR_PACKAGES = ("accel_state", "accel_ops", "accel_data", "accel_ckpt", "accel_launch", "accel")


def is_ours(cls: type) -> bool:
    """Whether ``cls`` is defined in one of accel's packages."""
    return cls.__module__.split(".")[0] in OUR_PACKAGES


def public_members(cls: type) -> dict[str, type]:
    """Each public member name of ``cls`` defined by accel's classes, with the class defining it.

    Enum members and the names of dataclass fields count as members; dunder and private names
    do not.
    """
    found: dict[str, type] = {}
    for klass in reversed([klass for klass in cls.__mro__ if is_ours(klass)]):
        for name in vars(klass):
            if not name.startswith("_"):
                found[name] = klass
    for name in getattr(cls, "__dataclass_fields__", {}):
        if not name.startswith("_"):
            found.setdefault(name, cls)
    return found


def inherited_public_names(cls: type) -> list[str]:
    """The public members ``cls`` inherits from accel's own bases (not defined on ``cls``)."""
    return sorted(name for name, owner in public_members(cls).items() if owner is not cls)


def is_class(obj: object) -> bool:
    """Whether ``obj`` is a class whose members the reference must list."""
    return inspect.isclass(obj) and is_ours(obj)


def methods_and_properties(cls: type) -> list[str]:
    """The public methods and properties of ``cls`` (its own and those from accel's bases)."""
    names = []
    for name in public_members(cls):
        try:
            member = inspect.getattr_static(cls, name)
        except AttributeError:  # a dataclass field without a default
            continue
        if inspect.isfunction(member) or isinstance(member, property | staticmethod | classmethod):
            names.append(name)
    return names
