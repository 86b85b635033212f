"""The error ``notebook_launcher`` raises when a worker fails (imported with torch, when needed)."""

from __future__ import annotations

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from accel_launch.errors import JobFailedError


class NotebookJobFailedError(JobFailedError, ChildFailedError):
    """A forked worker failed: torch's ``ChildFailedError`` (as Accelerate raises) and ours.

    ``failures`` maps each failed global rank to torch's ``ProcessFailure``; the message names
    the first failure and holds its traceback; ``exit_code`` is what a launcher would exit with.
    """

    def __init__(self, error: ChildFailedError, summary: str, exit_code: int) -> None:
        JobFailedError.__init__(self, summary, exit_code)
        self.name = error.name
        self.failures = error.failures

    def __str__(self) -> str:
        return str(self.args[0])
