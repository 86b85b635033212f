"""``GradientState``: the few flags that dataloaders and the Accelerator share during training."""

from __future__ import annotations

import weakref
from typing import Any, ClassVar

from accel_state.shared import shared_dict

_DEFAULT_PLUGIN = {
    "num_steps": 1,
    "adjust_scheduler": True,
    "sync_with_dataloader": True,
    "sync_each_batch": False,
}


class GradientState:
    """Process-wide record of the gradient-accumulation step and the active dataloaders.

    The prepared dataloader tells it when the epoch's last batch is yielded and how many samples
    of that batch are duplicates (``remainder``); the Accelerator reads those to decide when to
    synchronise gradients and what ``gather_for_metrics`` must drop.

    Args:
        gradient_accumulation_plugin: Optional mapping (or object with ``to_kwargs()``) of
            ``num_steps``, ``adjust_scheduler``, ``sync_with_dataloader``, ``sync_each_batch``.

    """

    _shared_state: ClassVar[dict[str, Any]] = shared_dict("GradientState")

    def __init__(self, gradient_accumulation_plugin: Any = None) -> None:
        self.__dict__ = self._shared_state
        if not self.initialized:
            self.sync_gradients = True
            self.end_of_dataloader = False
            self.remainder = -1
            self.plugin_kwargs: dict[str, Any] = dict(_DEFAULT_PLUGIN)
            self._dataloader_refs: list[weakref.ReferenceType[Any]] = []
        if gradient_accumulation_plugin is not None:
            settings = (
                gradient_accumulation_plugin.to_kwargs()
                if hasattr(gradient_accumulation_plugin, "to_kwargs")
                else dict(gradient_accumulation_plugin)
            )
            unknown = set(settings) - set(_DEFAULT_PLUGIN)
            if unknown:
                raise ValueError(
                    f"Unknown gradient accumulation settings {sorted(unknown)}; "
                    f"accepted: {sorted(_DEFAULT_PLUGIN)}."
                )
            self.plugin_kwargs.update(settings)

    @property
    def initialized(self) -> bool:
        """Whether the shared record has been filled."""
        return "sync_gradients" in self._shared_state

    @classmethod
    def _reset_state(cls) -> None:
        """Forget everything (tests only)."""
        cls._shared_state.clear()

    # Settings of the accumulation plugin -------------------------------------------------
    @property
    def num_steps(self) -> int:
        """Micro-steps per optimizer step."""
        return int(self.plugin_kwargs["num_steps"])

    @property
    def adjust_scheduler(self) -> bool:
        """Whether the scheduler's step count is adjusted for accumulation."""
        return bool(self.plugin_kwargs["adjust_scheduler"])

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether the end of a dataloader forces a gradient sync."""
        return bool(self.plugin_kwargs["sync_with_dataloader"])

    @property
    def sync_each_batch(self) -> bool:
        """Whether gradients are synchronised on every micro-step (saves memory)."""
        return bool(self.plugin_kwargs["sync_each_batch"])

    # Dataloader bookkeeping --------------------------------------------------------------
    @property
    def active_dataloader(self) -> Any:
        """The innermost dataloader currently being iterated, or ``None``."""
        refs = [ref() for ref in self._dataloader_refs]
        live = [loader for loader in refs if loader is not None]
        return live[-1] if live else None

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared dataloader is being iterated."""
        return self.active_dataloader is not None

    @property
    def dataloader_references(self) -> list[Any]:
        """``None`` followed by the dataloaders being iterated, outermost first (as Accelerate).

        The last entry is :attr:`active_dataloader`.
        """
        return [None, *(loader for ref in self._dataloader_refs if (loader := ref()) is not None)]

    def add_dataloader(self, dataloader: Any) -> None:
        """Record that ``dataloader`` started iterating."""
        self._dataloader_refs.append(weakref.ref(dataloader))
        self.end_of_dataloader = False
        self.remainder = -1

    def remove_dataloader(self, dataloader: Any) -> None:
        """Record that ``dataloader`` finished (or abandoned) iterating."""
        self._dataloader_refs = [
            ref for ref in self._dataloader_refs if ref() is not None and ref() is not dataloader
        ]
        if not self._dataloader_refs:
            self.end_of_dataloader = False

    def set_end_of_dataloader(self, end_of_dataloader: bool) -> None:
        """Mark whether the batch about to be yielded is the last of the epoch."""
        self.end_of_dataloader = end_of_dataloader

    def set_remainder(self, remainder: int) -> None:
        """Record how many samples of the last batch are real (``-1``: no padding happened)."""
        self.remainder = remainder

    def set_sync_gradients(self, sync_gradients: bool) -> None:
        """Set whether the current micro-step synchronises gradients and steps the optimizer."""
        self.sync_gradients = sync_gradients

    # Accelerate's private spellings, which transformers and Accelerate's tests call.
    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        """Accelerate's name for :meth:`set_sync_gradients`."""
        self.set_sync_gradients(sync_gradients)

    def _add_dataloader(self, dataloader: Any) -> None:
        """Accelerate's name for :meth:`add_dataloader`."""
        self.add_dataloader(dataloader)

    def _remove_dataloader(self, dataloader: Any) -> None:
        """Accelerate's name for :meth:`remove_dataloader`."""
        self.remove_dataloader(dataloader)

    def _set_end_of_dataloader(self, end_of_dataloader: bool) -> None:
        """Accelerate's name for :meth:`set_end_of_dataloader`."""
        self.set_end_of_dataloader(end_of_dataloader)

    def _set_remainder(self, remainder: int) -> None:
        """Accelerate's name for :meth:`set_remainder`."""
        self.set_remainder(remainder)

    def __repr__(self) -> str:
        return (
            f"GradientState(sync_gradients={self.sync_gradients}, "
            f"end_of_dataloader={self.end_of_dataloader}, remainder={self.remainder}, "
            f"num_steps={self.num_steps}, in_dataloader={self.in_dataloader})"
        )
