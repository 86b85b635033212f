"""The Accelerator's experiment trackers: start them, log to them, end the run."""

from __future__ import annotations

from typing import Any

from accel.errors import AcceleratorConfigError
from accel.job_facts import ProcessFacts
from accel.process_control import ProcessControlMixin
from accel.tracking.base import GeneralTracker
from accel.tracking.registry import tracker_class
from accel_state import reset_state


class TrackersMixin(ProcessControlMixin):
    """``init_trackers``, ``log``, ``get_tracker`` and ``end_training`` (Accelerate's names).

    The host class provides ``log_with`` (resolved by :func:`accel.tracking.resolve.resolve_trackers`).
    """

    log_with: list[str | GeneralTracker]
    trackers: list[GeneralTracker]

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Start the trackers given in ``log_with`` (main process only) and record ``config``.

        Args:
            project_name: Run name; file-based trackers write under ``logging_dir/project_name``.
            config: Hyper-parameters to store.
            init_kwargs: Per-tracker keyword arguments, keyed by tracker name.

        Raises:
            AcceleratorConfigError: A file-based tracker without ``project_dir``/``logging_dir``
                (the Accelerator refuses those already; trackers given as objects are not checked).
        """
        init_kwargs = init_kwargs or {}
        self.trackers = []
        for entry in self.log_with:
            if isinstance(entry, GeneralTracker):
                tracker = entry
            elif self.is_main_process:
                built_in: Any = tracker_class(entry)
                kwargs = init_kwargs.get(entry, {})
                if not built_in.requires_logging_directory:
                    tracker = built_in(project_name, **kwargs)
                elif self.logging_dir is None:
                    raise AcceleratorConfigError(
                        f"log_with={entry!r} writes files: pass project_dir=... or "
                        "project_config=ProjectConfiguration(logging_dir=...) to the Accelerator."
                    )
                else:
                    tracker = built_in(project_name, self.logging_dir, **kwargs)
            else:
                continue
            if tracker.main_process_only and not self.is_main_process:
                continue
            self.trackers.append(tracker)
            tracker.start()
            if config is not None:
                tracker.store_init_configuration(config)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its underlying object with ``unwrap=True``).

        Raises:
            AcceleratorConfigError: No tracker of that name was started on the main process.
        """
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if not self.is_main_process:
            return None
        raise AcceleratorConfigError(
            f"No tracker named {name!r}; started: {[t.name for t in self.trackers]} (see log_with)."
        )

    def log(
        self,
        values: dict[str, Any],
        step: int | None = None,
        log_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Log ``values`` at ``step`` to every tracker (main process only)."""
        log_kwargs = log_kwargs or {}
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def end_training(self) -> None:
        """End the run: close the trackers, wait for every process, stop the process group."""
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
        self.wait_for_everyone()
        self._ended_facts = ProcessFacts.of(self.state.partial)
        reset_state()
