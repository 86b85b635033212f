"""Exception hierarchy of accel-state: every error this package raises derives from AccelStateError."""

from __future__ import annotations


class AccelStateError(Exception):
    """Base class of every error raised by accel-state."""


class EnvironmentConfigError(AccelStateError, ValueError):
    """An environment variable is missing, malformed, or contradicts another one."""


class DeviceSelectionError(AccelStateError, RuntimeError):
    """The requested device or communication backend is not available on this machine."""


class ProcessGroupError(AccelStateError, RuntimeError):
    """Starting, adopting or tearing down the process group failed."""


class StateConflictError(AccelStateError, RuntimeError):
    """The process-wide state is already initialised with settings that contradict a new request."""


class ParallelismConfigError(AccelStateError, ValueError):
    """A ``ParallelismConfig`` degree or setting is invalid, or does not fit the job."""


class PartialStateResetError(AccelStateError, AttributeError):
    """A setting of a ``PartialState`` read after ``PartialState._reset_state()`` cleared it.

    An ``AttributeError`` too, as Accelerate raises there: the setting is no longer an attribute.
    """


class FaultToleranceUnavailableError(AccelStateError, ImportError):
    """Fault tolerance across replica groups needs torchft, which is not installed."""


class ReplicaQuorumError(AccelStateError, RuntimeError):
    """No quorum of replica groups formed for a step (too few groups alive, or no lighthouse)."""


class TorchFeatureError(AccelStateError, RuntimeError):
    """A feature needs a newer torch than the one installed (see ``accel_state.torch_compat``).

    Attributes:
        feature: The feature asked for.
        found: The torch version installed.
        minimum: The oldest torch release that has the feature.
        alternative: What works instead on this torch.
    """

    def __init__(
        self,
        message: str,
        *,
        feature: str = "",
        found: str = "",
        minimum: str = "",
        alternative: str = "",
    ) -> None:
        super().__init__(message)
        self.feature = feature
        self.found = found
        self.minimum = minimum
        self.alternative = alternative
