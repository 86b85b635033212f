"""Patching a name on one of Accelerate's module paths reaches the accel code that uses it.

In Accelerate, ``dispatch_model`` and ``check_device_map`` live side by side in
``accelerate.big_modeling``, so a library that swaps ``accelerate.big_modeling.check_device_map``
for a while changes what ``dispatch_model`` calls. transformers does exactly that for models that
keep some weights out of the device map (``_no_placement_params``). accel's module is a door to
accel-ckpt, whose functions look their helpers up in their own modules: setting the door's
attribute alone would change nothing. A door of class :class:`PatchForwardingModule` passes each
replacement of one of its names on to every accel domain module (``accel_*``) that holds the same
object under that name, and passes the restore on the same way. A door inside ``accel`` whose
code lives in ``accel``'s own domain modules (``accel.utils.imports`` -> ``accel.availability``)
names them with :func:`serve_as_door`, and its replacements reach those modules too.

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
            replace_in_domain(name, previous, value, self.__dict__.get("__domain__", ()))


def replace_in_domain(
    name: str, previous: object, value: object, also: tuple[str, ...] = ()
) -> list[str]:
    """Set ``name`` to ``value`` in every accel domain module where it is ``previous``.

    Args:
        name: The attribute replaced.
        previous: The object it was.
        value: The object it is now.
        also: Further modules to change (a door's own domain modules inside ``accel``).

    Returns:
        The names of the modules changed.
    """
    changed = []
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name.startswith(DOMAIN_PREFIXES) or module_name in also):
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


def serve_as_door(name: str, *domain: str) -> None:
    """Make module ``name`` a door whose replaced names also reach ``domain`` (called by a mirror).

    Args:
        name: The door's module name (its ``__name__``).
        domain: The ``accel`` modules that hold the door's code.
    """
    module = sys.modules[name]
    module.__domain__ = domain  # type: ignore[attr-defined]
    forward_patches(module)
