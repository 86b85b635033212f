"""Exception hierarchy of accel-ops: every error this package raises derives from AccelOpsError."""

from __future__ import annotations

from collections.abc import Sequence


class AccelOpsError(Exception):
    """Base class of every error raised by accel-ops."""


class InvalidArgumentError(AccelOpsError, ValueError):
    """An argument holds a value the operation cannot use; the message names it and the fix."""


class UnsupportedTypeError(AccelOpsError, TypeError):
    """A leaf of a nested structure is of a type the operation cannot handle.

    Attributes:
        operation: Name of the function that was applied.
        value_type: Type of the offending leaf.
        path: Where the leaf sits inside the structure (keys, indices and fields, outermost first).
        expected: What the operation accepts at that place.
        hint: How to fix the call.

    """

    def __init__(
        self,
        operation: str,
        value_type: type,
        expected: str,
        hint: str = "",
        path: Sequence[str] = (),
    ) -> None:
        self.operation = operation
        self.value_type = value_type
        self.expected = expected
        self.hint = hint
        self.path: list[str] = list(path)
        super().__init__()

    def __str__(self) -> str:
        where = f" at data{''.join(self.path)}" if self.path else ""
        message = (
            f"{self.operation} got a {self.value_type.__module__}.{self.value_type.__qualname__}"
            f"{where}; it accepts {self.expected}."
        )
        return f"{message} {self.hint}" if self.hint else message

    def __reduce__(self) -> tuple[object, ...]:
        return (
            type(self),
            (self.operation, self.value_type, self.expected, self.hint, self.path),
        )


class DistributedOperationError(AccelOpsError, RuntimeError):
    """The processes passed operands that cannot take part in the same collective.

    Raised on every process at once (debug mode compares every process's operands before the
    collective), instead of the hang or the garbage the mismatch would otherwise give.

    Attributes:
        operation: The collective that was about to run, e.g. ``accel_ops.gather``.
        descriptions: Per process (indexed by rank), a readable description of its operands.

    """

    def __init__(self, message: str, operation: str = "", descriptions: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.operation = operation
        self.descriptions = list(descriptions)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.operation, self.descriptions))


class CollectiveTimeoutError(DistributedOperationError):
    """A collective waited longer than the process-group timeout: some process never entered it.

    The message names the operation, its sequence number on this process and the caller's line,
    and where the other processes are (``descriptions``, indexed by rank; empty for a process that
    gave no report).
    """


class CollectiveFailedError(DistributedOperationError):
    """A collective failed because another process left the job (it failed or was stopped)."""


#: Accelerate's name for the error debug mode raises (``accelerate.utils.operations``).
DistributedOperationException = DistributedOperationError


class XLAUnavailableError(AccelOpsError, ImportError):
    """The process group uses the ``xla`` backend but ``torch_xla`` cannot be imported."""


class CannotPadNestedTensorWarning(UserWarning):
    """A nested (jagged) tensor was passed to ``pad_across_processes``; it is left as it is."""
