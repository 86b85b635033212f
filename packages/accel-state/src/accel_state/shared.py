"""The single home of process-wide state, so tests (and notebooks) can inspect and reset it.

State classes such as :class:`~accel_state.PartialState` keep their attributes in a dictionary
obtained from :func:`shared_dict`; every instance of a class shares that dictionary.
:func:`reset_state` empties them all and stops the process group this package started.
Packages built on this one that keep process-wide values of their own elsewhere (a counter, a
cached reading of the environment) register a function with :func:`on_reset`, so that one call
forgets everything.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable
from typing import Any

_REGISTRY: dict[str, dict[str, Any]] = {}
_RESET_HOOKS: list[Callable[[], None]] = []


def shared_dict(name: str) -> dict[str, Any]:
    """Return the process-wide attribute dictionary registered under ``name``."""
    return _REGISTRY.setdefault(name, {})


def snapshot() -> dict[str, dict[str, Any]]:
    """A shallow copy of every registered dictionary, for inspection and debugging."""
    return {name: dict(values) for name, values in _REGISTRY.items()}


def on_reset(hook: Callable[[], None]) -> Callable[[], None]:
    """Have :func:`reset_state` call ``hook`` (once per registration of the same function).

    Returns:
        ``hook`` itself, so this can decorate a function.

    """
    if hook not in _RESET_HOOKS:
        _RESET_HOOKS.append(hook)
    return hook


def reset_state(stop_process_group: bool = True) -> None:
    """Forget all process-wide state (with what :func:`on_reset` hooks forget).

    Args:
        stop_process_group: Also destroy the default process group when accel-state started it
            (one adopted from the caller is left alone).

    """
    partial = _REGISTRY.get("PartialState", {})
    if stop_process_group and partial.get("owns_process_group"):
        from accel_state.process_group import stop_process_group as stop

        stop()
    for values in _REGISTRY.values():
        values.clear()
    for hook in _RESET_HOOKS:
        hook()


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """Accept any arguments and return None (a stand-in callable, as in Accelerate)."""
    return None


class ThreadLocalSharedDict(threading.local):
    """A class attribute (descriptor) holding one dictionary per thread, shared by the instances.

    ``Cls._shared_state`` and ``instance._shared_state`` give the same dictionary of the current
    thread; ``instance._shared_state = {...}`` replaces it (assigning on the class replaces the
    descriptor itself, so clear it in place instead). Accelerate uses it for PyTorch/XLA's
    multithreaded mode, where each thread drives its own device.

    Args:
        thread_local: Accepted for Accelerate's signature; the storage is always per thread.
    """

    def __init__(self, thread_local: bool = False) -> None:
        self._storage: dict[str, Any] = {}

    def __get__(self, obj: object, objtype: type | None = None) -> dict[str, Any]:
        return self._storage

    def __set__(self, obj: object, value: dict[str, Any]) -> None:
        self._storage = value


#: The type of a state class's shared dictionary, as in Accelerate: a plain ``dict`` (one per
#: process; accel keeps its state dictionaries in :func:`shared_dict`'s registry), or
#: :class:`ThreadLocalSharedDict` where ``torch_xla`` is installed.
SharedDict: type[Any] = (
    ThreadLocalSharedDict if importlib.util.find_spec("torch_xla") is not None else dict
)
