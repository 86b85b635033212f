"""The tracker classes by ``log_with`` name: the built-in ones and those registered by users."""

from __future__ import annotations

import warnings

from accel.errors import AcceleratorConfigError
from accel.tracking.base import GeneralTracker, LoggerType
from accel.tracking.hosted import MLflowTracker, WandBTracker
from accel.tracking.local import CSVTracker, JSONLinesTracker, TensorBoardTracker
from accel.tracking.services import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    SwanLabTracker,
    TrackioTracker,
)

#: Tracker classes by ``log_with`` name: the one registry ``init_trackers`` creates trackers from.
LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    LoggerType.JSONL.value: JSONLinesTracker,
    LoggerType.CSV.value: CSVTracker,
    LoggerType.TENSORBOARD.value: TensorBoardTracker,
    LoggerType.WANDB.value: WandBTracker,
    LoggerType.MLFLOW.value: MLflowTracker,
    LoggerType.COMETML.value: CometMLTracker,
    LoggerType.AIM.value: AimTracker,
    LoggerType.CLEARML.value: ClearMLTracker,
    LoggerType.DVCLIVE.value: DVCLiveTracker,
    LoggerType.SWANLAB.value: SwanLabTracker,
    LoggerType.TRACKIO.value: TrackioTracker,
}


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make ``log_with=tracker_class.name`` create ``tracker_class`` (register before the Accelerator).

    The class is created with ``(project_name, **init_kwargs)``, or ``(project_name, logging_dir,
    **init_kwargs)`` when its ``requires_logging_directory`` is true. A name already registered
    (a built-in one included) is replaced, with a warning.

    Raises:
        AcceleratorConfigError: ``tracker_class`` is not a ``GeneralTracker`` subclass, or lacks a
            non-empty ``name`` or a ``requires_logging_directory`` class attribute.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise AcceleratorConfigError(
            f"register_tracker_class(tracker_class={tracker_class!r}): pass a subclass of "
            "accel.tracking.GeneralTracker."
        )
    name = tracker_class.__dict__.get("name") or getattr(tracker_class, "name", None)
    if not name or name == GeneralTracker.name:
        raise AcceleratorConfigError(
            f"register_tracker_class({tracker_class.__name__}): the class needs a non-empty "
            "`name` class attribute (the log_with name), e.g. name = 'my_tracker'."
        )
    if not _defines_directory_flag(tracker_class):
        raise AcceleratorConfigError(
            f"register_tracker_class({tracker_class.__name__}): the class needs a "
            "`requires_logging_directory` class attribute: True if it writes under the "
            "Accelerator's logging_dir, else False."
        )
    if name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(
            f"A tracker named '{name}' is already registered ({LOGGER_TYPE_TO_CLASS[name]!r}); "
            f"{tracker_class!r} replaces it.",
            UserWarning,
            stacklevel=2,
        )
    LOGGER_TYPE_TO_CLASS[name] = tracker_class


def _defines_directory_flag(tracker_class: type[GeneralTracker]) -> bool:
    """Whether a class below ``GeneralTracker`` sets ``requires_logging_directory``."""
    return any(
        "requires_logging_directory" in vars(klass)
        for klass in tracker_class.__mro__
        if klass is not GeneralTracker and issubclass(klass, GeneralTracker)
    )


def tracker_class(name: str) -> type[GeneralTracker]:
    """The tracker class registered as ``name`` (``"jsonl"``, ``"wandb"``...).

    Raises:
        KeyError: No tracker is registered under ``name``.
    """
    return LOGGER_TYPE_TO_CLASS[name]
