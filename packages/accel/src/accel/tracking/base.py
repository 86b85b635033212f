"""The tracker base class, the tracker names and ``on_main_process``: what every tracker builds on.

:mod:`accel.tracking` re-exports them (Accelerate's module path).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from accel_state import PartialState

_Method = TypeVar("_Method", bound=Callable[..., Any])


class LoggerType(enum.Enum):
    """Names of the built-in trackers (``ALL`` picks every one that can run here).

    As in Accelerate, a member prints as its value (``str(LoggerType.WANDB) == "wandb"``) but is
    not a string: compare ``member.value`` (or ``str(member)``) with a tracker name.
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return format(str(self.value), format_spec)

    @classmethod
    def list(cls) -> list[str]:
        """Return the values of all members."""
        return [str(member) for member in cls]

    ALL = "all"
    JSONL = "jsonl"
    CSV = "csv"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"
    COMETML = "comet_ml"
    AIM = "aim"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    TRACKIO = "trackio"


class GeneralTracker:
    """Base class of every tracker; subclass it to plug in your own.

    Subclasses set ``name`` and ``requires_logging_directory`` and implement ``log``
    (``store_init_configuration``, ``start`` and ``finish`` are optional).
    """

    name: str = "general"
    requires_logging_directory: bool = False
    main_process_only: bool = True

    def __init__(self, _blank: bool = False) -> None:
        """Accelerate's signature; ``_blank`` is accepted and has nothing to skip here.

        Accelerate checks that a subclass defines ``name``, ``requires_logging_directory`` and
        ``tracker`` unless ``_blank=True``; accel's base class provides all three.
        """

    @property
    def tracker(self) -> Any:
        """The underlying object (writer, run...) this tracker drives."""
        return self

    def start(self) -> None:
        """Open the run (optional): ``Accelerator.init_trackers`` calls it before storing the config.

        Override it to create the run lazily, after the process group exists; the built-in
        trackers open theirs in ``__init__`` and keep this default, which does nothing.
        """

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Record the run's hyper-parameters (optional; the default keeps nothing)."""

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` (name -> number or text) at ``step`` (the default keeps nothing).

        Not abstract, as in Accelerate: a tracker that only stores its configuration may
        leave it out.
        """

    def finish(self) -> None:
        """Flush and close (optional; the default has nothing to close)."""


def on_main_process(function: _Method) -> _Method:
    """Run a tracker method on the main process only when its tracker is ``main_process_only``.

    The check happens at call time, so decorating a method creates no ``PartialState``.
    """

    @functools.wraps(function)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False) and not PartialState().is_main_process:
            return None
        return function(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
