"""Resolve ``log_with`` into tracker names and objects, checking what each needs to run here.

The registry is read as ``registry.LOGGER_TYPE_TO_CLASS`` at call time, so a registry replaced
on :mod:`accel.tracking.registry` (as tests do) is the one used.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel.tracking import registry
from accel.tracking.base import GeneralTracker, LoggerType
from accel.tracking.local import tensorboard_available
from accel.tracking.packages import (
    TRACKER_PACKAGES,
    missing_package_error,
    tracker_package_available,
)


def _available(name: str) -> bool:
    """Whether the tracker called ``name`` can start here (its package is installed)."""
    if name == LoggerType.TENSORBOARD.value:
        return tensorboard_available()
    if name in TRACKER_PACKAGES:
        return tracker_package_available(name)
    return True


def get_available_trackers() -> list[LoggerType]:
    """The built-in trackers whose package is installed here."""
    return [
        member for member in LoggerType if member is not LoggerType.ALL and _available(member.value)
    ]


def resolve_trackers(log_with: Any) -> list[str | GeneralTracker]:
    """Normalise ``log_with`` into tracker names and ready tracker objects.

    Args:
        log_with: A name, ``LoggerType``, ``GeneralTracker`` instance, ``"all"``, or a list of
            those. ``"all"`` picks every built-in tracker whose package is installed.

    Raises:
        AcceleratorConfigError: An unknown tracker name.
        UnsupportedFeatureError: A named tracker whose package is missing (the message says
            what to install).
    """
    if log_with is None:
        return []
    items: Iterable[Any] = log_with if isinstance(log_with, (list, tuple)) else [log_with]
    resolved: list[str | GeneralTracker] = []
    for item in items:
        if isinstance(item, GeneralTracker):
            resolved.append(item)
            continue
        name = item.value if isinstance(item, LoggerType) else str(item)
        if name not in registry.LOGGER_TYPE_TO_CLASS:
            name = name.lower()
        if name == LoggerType.ALL.value:
            resolved.extend(
                member.value for member in get_available_trackers() if member.value not in resolved
            )
            continue
        if name not in registry.LOGGER_TYPE_TO_CLASS:
            raise AcceleratorConfigError(
                f"log_with={item!r} is not a known tracker; use one of "
                f"{', '.join([*registry.LOGGER_TYPE_TO_CLASS, 'all'])}, a GeneralTracker instance, or "
                "register your class with accel.tracking.register_tracker_class."
            )
        if not _available(name):
            if name == LoggerType.TENSORBOARD.value:
                raise UnsupportedFeatureError(
                    "log_with='tensorboard' needs the tensorboard package: "
                    "pip install 'accel[tensorboard]'."
                )
            raise missing_package_error(name)
        if name not in resolved:
            resolved.append(name)
    return resolved


def check_logging_directory(
    log_with: Iterable[str | GeneralTracker], logging_dir: str | os.PathLike[str] | None
) -> None:
    """Refuse trackers that write files when no logging directory is set.

    Raises:
        AcceleratorConfigError: A tracker named in ``log_with`` needs ``logging_dir``, which is None.
    """
    if logging_dir is not None:
        return
    for entry in log_with:
        if (
            isinstance(entry, str)
            and registry.LOGGER_TYPE_TO_CLASS[entry].requires_logging_directory
        ):
            raise AcceleratorConfigError(
                f"log_with={entry!r} writes files, so it needs a logging_dir: pass "
                "project_dir=... or project_config=ProjectConfiguration(logging_dir=...) to "
                "the Accelerator."
            )


def filter_trackers(
    log_with: Any, logging_dir: str | os.PathLike[str] | None = None
) -> list[str | GeneralTracker]:
    """The trackers ``log_with`` asks for that can run with ``logging_dir``.

    Like :func:`resolve_trackers`, and a tracker that writes files needs ``logging_dir``: one
    named explicitly is refused without it, while ``"all"`` leaves such trackers out.

    Raises:
        AcceleratorConfigError: An unknown tracker, or one named explicitly that writes files
            while ``logging_dir`` is None.
        UnsupportedFeatureError: A named tracker whose package is missing.
    """
    items: list[Any] = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    explicit = [item for item in items if item is not None and not _means_all(item)]
    check_logging_directory(resolve_trackers(explicit), logging_dir)
    resolved = resolve_trackers(items if log_with is not None else None)
    if logging_dir is not None:
        return resolved
    return [
        entry
        for entry in resolved
        if isinstance(entry, GeneralTracker)
        or not registry.LOGGER_TYPE_TO_CLASS[entry].requires_logging_directory
    ]


def _means_all(item: Any) -> bool:
    return item is LoggerType.ALL or (
        isinstance(item, str) and item.lower() == LoggerType.ALL.value
    )
