"""Patching a name on one of Accelerate's module paths reaches the accel code that uses it.

In Accelerate, ``dispatch_model`` and ``check_device_map`` live side by side in
``accelerate.big_modeling``, so a library that swaps ``accelerate.big_modeling.check_device_map``
for a while changes what ``dispatch_model`` calls. transformers does exactly that for models that
keep some weights out of the device map (``_no_placement_params``). accel's module is a door to
accel-ckpt, whose functions look their helpers up in their own modules: setting the door's
attribute alone would change nothing. A door of class :class:`PatchForwardingModule` passes each
replacement of one of its names on to every accel domain module (``accel_*``) that holds the same
object under that name, and passes the restore on the same way.

Example:
    >>> import types
    >>> door = types.ModuleType("door")
    >>> forward_patches(door)
    >>> type(door).__name__
    'PatchForwardingModule'
"""

from __future__ import annotations

import sys
import types
from typing import Any

#: Modules that hold accel's behaviour (the packages accel's doors re-export from).
DOMAIN_PREFIXES = ("accel_",)
_ABSENT = object()


class PatchForwardingModule(types.ModuleType):
    """A module whose attribute replacements also replace the same object in accel's domain."""

    def __setattr__(self, name: str, value: Any) -> None:
        previous = self.__dict__.get(name, _ABSENT)
        super().__setattr__(name, value)
        if previous is not _ABSENT and previous is not value and not name.startswith("__"):
            replace_in_domain(name, previous, value)


def replace_in_domain(name: str, previous: object, value: object) -> list[str]:
    """Set ``name`` to ``value`` in every accel domain module where it is ``previous``.

    Returns:
        The names of the modules changed.
    """
    changed = []
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith(DOMAIN_PREFIXES):
            continue
        namespace = getattr(module, "__dict__", None)
        if namespace is not None and namespace.get(name, _ABSENT) is previous:
            namespace[name] = value
            changed.append(module_name)
    return changed


def forward_patches(module: types.ModuleType) -> None:
    """Make ``module`` a :class:`PatchForwardingModule` (a plain module only; others are left)."""
    if type(module) is types.ModuleType:
        module.__class__ = PatchForwardingModule
