"""``get_logger``: a logger that logs on the main process only, or on every process in rank order."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from accel.errors import AcceleratorConfigError, AccelError
from accel_state import PartialState


class MultiProcessAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger adapter aware of the job's processes.

    Each logging call accepts ``main_process_only`` (default True: log on global rank 0 only) and
    ``in_order`` (log on every process, one rank after the other).
    """

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:
        state = PartialState()
        return not main_process_only or state.is_main_process

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log ``msg`` at ``level`` on the processes selected by the keyword options."""
        if not PartialState._shared_state:
            raise AccelError(
                "get_logger() needs the process state: create PartialState() or Accelerator() "
                "before logging."
            )
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            return
        if not in_order:
            if self._should_log(main_process_only):
                self.logger.log(level, msg, *args, **kwargs)
            return
        state = PartialState()
        for rank in range(state.num_processes):
            if rank == state.process_index:
                self.logger.log(level, msg, *args, **kwargs)
            state.wait_for_everyone()

    @functools.lru_cache(None)  # noqa: B019 - the cache is the point: one warning per message
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """Log a warning once per distinct message."""
        self.warning(*args, **kwargs)


#: Environment variables read for the default level, first set wins.
LOG_LEVEL_VARIABLES = ("ACCEL_LOG_LEVEL", "ACCELERATE_LOG_LEVEL")


def _default_level() -> str | None:
    for name in LOG_LEVEL_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def get_logger(name: str, log_level: str | int | None = None) -> MultiProcessAdapter:
    """A logger whose calls take ``main_process_only=True`` and ``in_order=False`` options.

    As in Accelerate, a level (given, or read from the environment) is set on the named logger
    and on the root logger.

    Args:
        name: Logger name, usually ``__name__``.
        log_level: Level (``"INFO"``, ``logging.DEBUG``...); default: ``ACCEL_LOG_LEVEL``, else
            ``ACCELERATE_LOG_LEVEL``, else the levels are left unchanged.

    Raises:
        AcceleratorConfigError: The level is not a logging level name or number (a
            ``ValueError``, as logging raises).
    """
    logger = logging.getLogger(name)
    level = log_level if log_level is not None else _default_level()
    if level is not None:
        resolved = level.upper() if isinstance(level, str) else level
        try:
            logger.setLevel(resolved)
        except (ValueError, TypeError):
            source = "log_level" if log_level is not None else _level_variable()
            raise AcceleratorConfigError(
                f"{source}={level!r} is not a logging level; use DEBUG, INFO, WARNING, ERROR, "
                "CRITICAL or a number."
            ) from None
        logging.getLogger().setLevel(resolved)
    return MultiProcessAdapter(logger, {})


def _level_variable() -> str:
    return next(name for name in LOG_LEVEL_VARIABLES if os.environ.get(name, "").strip())
