"""Long jobs survive: restarts, preemption, and collective timeouts, for one Accelerator.

* **Restarts.** ``accel launch --max_restarts N`` (torch elastic) restarts every worker when one
  dies; :attr:`FaultTolerance.restart_count` says how many times that happened, and the script
  resumes from ``accelerator.latest_checkpoint()`` (see docs/long-jobs/restarts.md).
* **Preemption.** Schedulers send SIGTERM before they kill a job (SLURM, Kubernetes, cloud spot
  instances); ``accel launch`` forwards it to every worker. The first read of
  :meth:`FaultTolerance.should_stop` installs a SIGTERM handler that only raises a flag; each
  later read agrees on it across processes with one small all-reduce, so every process sees
  True at the same step, saves and leaves its loop, and the launcher exits with
  :data:`accel_state.contract.REQUEUE_EXIT_CODE`. A second SIGTERM stops the process at once,
  but only one that comes :data:`REPEATED_SIGTERM_SECONDS` or more after the first: under
  ``srun accel launch`` slurmstepd signals every process of the step (the workers too) and the
  launcher forwards its own copy milliseconds later; both are one request.
* **Timeouts.** Unless the user set one, the process group starts with a long timeout (the
  first step may compile); after the first training step every process lowers it to the
  collective timeout (:meth:`accel_state.PartialState.lower_timeouts`), as torchtitan does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch

import accel_ops
from accel.slow_ranks import SlowRankMonitor
from accel.strategies.base import ModelStrategy
from accel_ops.records import record, register_internal_package
from accel_state import PartialState

logger = logging.getLogger(__name__)

# Collective records name the user's line: frames of this package are skipped.
register_internal_package(os.path.dirname(os.path.abspath(__file__)))

#: A SIGTERM that comes less than this many seconds after the first is the same request. SLURM
#: (``scancel --signal=TERM``, ``--signal=TERM@N``) signals every process of a step, the workers
#: included, and ``accel launch``, which got it too, forwards its own copy to each worker about
#: 3 ms later (more on a loaded machine); a Kubernetes pod's processes can likewise get the
#: kubelet's signal and the launcher's. Taking the copy as "stop at once" would lose the save
#: that the first one asked for. A person or scheduler that really insists (a second
#: ``scancel``, SLURM's time-limit SIGTERM after ``--signal=TERM@N``) does so seconds later.
REPEATED_SIGTERM_SECONDS = 2.0


class FaultTolerance:
    """Restart count, preemption flag and timeout lowering of one Accelerator.

    Args:
        state: The process's state (ranks, device, timeouts).
        strategy: The model strategy, whose clocks the slow-rank report reads
            (see :mod:`accel.slow_ranks`).
    """

    def __init__(self, state: PartialState, strategy: ModelStrategy | None = None) -> None:
        self.state = state
        self._strategy = strategy
        self.stop_requested = False  # this process got SIGTERM
        self.stopping = False  # every process agreed to stop
        self._installed = False
        self._first_sigterm_at = 0.0  # time.monotonic() of the first SIGTERM
        self._previous: Any = None
        self._backward_calls = 0
        self.slow_ranks: SlowRankMonitor | None = None  # made at the first backward (group up)
        self._slow_ranks_paused = 0

    @property
    def restart_count(self) -> int:
        """How many times torch elastic restarted the workers before this attempt (0 at first)."""
        return self.state.restart_count

    # ------------------------------------------------------------------ preemption
    def should_stop(self) -> bool:
        """Collective: True on every process once any process got SIGTERM.

        Read it at the same point on every process (once per step). The first read installs
        the SIGTERM handler.
        """
        if not self._installed:
            self._install()
        if self.stopping:
            return True
        if not self.state.use_distributed:
            self.stopping = self.stop_requested
            return self.stopping
        with record("should_stop"):
            flag = torch.tensor(1 if self.stop_requested else 0, device=self.state.device)
            self.stopping = bool(accel_ops.reduce(flag, reduction="max").item())
        return self.stopping

    def _install(self) -> None:
        self._installed = True
        if threading.current_thread() is not threading.main_thread():
            logger.warning(
                "should_stop is read outside the main thread, where no signal handler can be "
                "installed: this process will not notice SIGTERM (the others still agree)."
            )
            return
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """First SIGTERM: raise the flag. A later one: what would have happened without us.

        A copy arriving within :data:`REPEATED_SIGTERM_SECONDS` of the first (the launcher
        forwarding the scheduler's signal that reached this worker directly) is ignored.
        """
        now = time.monotonic()
        if not self.stop_requested:
            self.stop_requested = True
            self._first_sigterm_at = now
            logger.warning(
                "Process %d got SIGTERM: stopping after this step (save, then leave the loop).",
                self.state.process_index,
            )
            return
        if now - self._first_sigterm_at < REPEATED_SIGTERM_SECONDS:
            logger.info(
                "Process %d got SIGTERM again %.3f s after the first: the same request (the "
                "scheduler signals every process and the launcher forwards its copy).",
                self.state.process_index,
                now - self._first_sigterm_at,
            )
            return
        previous = self._previous
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    def uninstall(self) -> None:
        """Give SIGTERM back to the handler that was there before."""
        if self._installed and self._previous is not None:
            with contextlib.suppress(ValueError):  # not the main thread
                signal.signal(signal.SIGTERM, self._previous)
        self._installed = False

    # ------------------------------------------------------------------ timeouts
    @contextlib.contextmanager
    def backward(self, loss: torch.Tensor) -> Iterator[None]:
        """Around each backward pass: record it, and lower the timeouts once a step is done.

        The second backward starts after the first one (and its compilation) finished on every
        process, so that is where every process lowers its timeout together.
        """
        self._backward_calls += 1
        if self._backward_calls == 2 and self.state.timeout > self.state.collective_timeout:
            with record("wait_for_everyone (lowering the timeouts after the first step)"):
                self.state.lower_timeouts()
        timed = not self._slow_ranks_paused
        if timed and self.slow_ranks is None:
            self.slow_ranks = SlowRankMonitor(self.state, self._strategy)
        if timed and self.slow_ranks is not None:
            self.slow_ranks.before_backward()
        with record("backward", loss):
            yield
        if timed and self.slow_ranks is not None:
            self.slow_ranks.after_backward()

    # The slow-rank report's clocks (a prepared dataloader's FetchObserver, the optimizer's step).
    def _timing(self) -> SlowRankMonitor | None:
        return None if self._slow_ranks_paused else self.slow_ranks

    def fetch_started(self) -> None:
        """A prepared dataloader was asked for a batch."""
        monitor = self._timing()
        if monitor is not None:
            monitor.fetch_started()

    def fetch_finished(self) -> None:
        """The batch is ready."""
        monitor = self._timing()
        if monitor is not None:
            monitor.fetch_finished()

    def step_started(self) -> None:
        """A prepared optimizer's step begins."""
        monitor = self._timing()
        if monitor is not None:
            monitor.step_started()

    def step_finished(self) -> None:
        """A prepared optimizer's step ended."""
        monitor = self._timing()
        if monitor is not None:
            monitor.step_finished()

    @contextlib.contextmanager
    def slow_ranks_paused(self) -> Iterator[None]:
        """Neither time nor count backward passes inside the block (uneven inputs under Join).

        Processes out of batches stop calling backward there, so their counts would drift
        apart and the report's exchange would meet another rank's gradient all-reduce.
        """
        self._slow_ranks_paused += 1
        try:
            yield
        finally:
            self._slow_ranks_paused -= 1
            if self.slow_ranks is not None:
                self.slow_ranks.restart_gap()
