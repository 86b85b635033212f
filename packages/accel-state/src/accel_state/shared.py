"""The single home of process-wide state, so tests (and notebooks) can inspect and reset it.

State classes such as :class:`~accel_state.PartialState` keep their attributes in a dictionary
obtained from :func:`shared_dict`; every instance of a class shares that dictionary.
:func:`reset_state` empties them all and stops the process group this package started.
"""

from __future__ import annotations

from typing import Any

_REGISTRY: dict[str, dict[str, Any]] = {}


def shared_dict(name: str) -> dict[str, Any]:
    """Return the process-wide attribute dictionary registered under ``name``."""
    return _REGISTRY.setdefault(name, {})


def snapshot() -> dict[str, dict[str, Any]]:
    """A shallow copy of every registered dictionary, for inspection and debugging."""
    return {name: dict(values) for name, values in _REGISTRY.items()}


def reset_state(stop_process_group: bool = True) -> None:
    """Forget all process-wide state.

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
