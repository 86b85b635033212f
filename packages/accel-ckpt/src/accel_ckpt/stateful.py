"""What checkpointing needs from objects, hooks and names, shared by the writer and the reader."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from torch import nn


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict(state)``."""

    def state_dict(self) -> Any:
        """The object's state."""

    def load_state_dict(self, state_dict: Any) -> Any:
        """Restore the object's state."""


#: ``hook(models, weights, folder)`` before writing; may pop from ``weights`` to skip a model and
#: write its own files into ``folder`` (the temporary folder, committed with the rest).
SaveHook = Callable[[list[nn.Module], list[dict[str, Any]], str], None]
#: ``hook(models, folder)`` before loading; may pop from ``models`` to load them itself.
LoadHook = Callable[[list[nn.Module], str], None]
#: Returns the user's model inside a wrapper.
Unwrap = Callable[[nn.Module], nn.Module]


def numbered(base: str, index: int, suffix: str = "") -> str:
    """``base<suffix>`` for the first object, ``base_<i><suffix>`` after (Accelerate's naming)."""
    return f"{base}{'' if index == 0 else f'_{index}'}{suffix}"
