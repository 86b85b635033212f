"""``GradientState``: the few flags that dataloaders and the Accelerator share during training."""

from __future__ import annotations

import weakref
from typing import Any, ClassVar

from accel_state.shared import shared_dict

#: The settings ``plugin_kwargs`` may hold, and the value each property falls back on when the
#: key is absent (Accelerate's fallbacks: a plugin's ``to_kwargs()`` drops fields left at the
#: plugin's own defaults, so ``adjust_scheduler`` reads False unless the key is present).
_PLUGIN_FALLBACKS: dict[str, Any] = {
    "num_steps": 1,
    "adjust_scheduler": False,
    "sync_with_dataloader": True,
    "sync_each_batch": False,
}


class GradientState:
    """Process-wide record of the gradient-accumulation step and the active dataloaders.

    The prepared dataloader tells it when the epoch's last batch is yielded and how many samples
    of that batch are duplicates (``remainder``); the Accelerator reads those to decide when to
    synchronise gradients and what ``gather_for_metrics`` must drop.

    ``plugin_kwargs`` is, as in Accelerate, the plugin's ``to_kwargs()`` (only the fields changed
    from the plugin's defaults), or ``{}`` when no plugin was ever given; building
    ``GradientState`` again with another plugin replaces it. The properties ``num_steps``,
    ``adjust_scheduler``, ``sync_with_dataloader`` and ``sync_each_batch`` read it with the
    fallbacks 1, False, True and False.

    Args:
        gradient_accumulation_plugin: Optional object with ``to_kwargs()`` (a
            ``GradientAccumulationPlugin``) or a mapping taken as those kwargs, with keys among
            ``num_steps``, ``adjust_scheduler``, ``sync_with_dataloader``, ``sync_each_batch``.

    Raises:
        ValueError: When the settings hold a key outside those four.

    """

    _shared_state: ClassVar[dict[str, Any]] = shared_dict("GradientState")

    def __init__(self, gradient_accumulation_plugin: Any = None) -> None:
        self.__dict__ = self._shared_state
        settings = (
            None
            if gradient_accumulation_plugin is None
            else _plugin_settings(gradient_accumulation_plugin)
        )
        if not self.initialized:
            self.sync_gradients = True
            self.end_of_dataloader = False
            self.remainder = -1
            self.plugin_kwargs: dict[str, Any] = {} if settings is None else settings
            self._dataloader_refs: list[weakref.ReferenceType[Any]] = []
        elif settings is not None and self.plugin_kwargs != settings:
            self.plugin_kwargs = settings

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
        return int(self.plugin_kwargs.get("num_steps", _PLUGIN_FALLBACKS["num_steps"]))

    @property
    def adjust_scheduler(self) -> bool:
        """Whether accumulating micro-steps advance the scheduler's ``_step_count``.

        False unless ``plugin_kwargs`` holds the key; as in Accelerate, a plugin's
        ``to_kwargs()`` never does (True is the plugin's default), so this reads False.
        """
        return bool(
            self.plugin_kwargs.get("adjust_scheduler", _PLUGIN_FALLBACKS["adjust_scheduler"])
        )

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether the end of a dataloader forces a gradient sync."""
        return bool(
            self.plugin_kwargs.get(
                "sync_with_dataloader", _PLUGIN_FALLBACKS["sync_with_dataloader"]
            )
        )

    @property
    def sync_each_batch(self) -> bool:
        """Whether gradients are synchronised on every micro-step (saves memory)."""
        return bool(self.plugin_kwargs.get("sync_each_batch", _PLUGIN_FALLBACKS["sync_each_batch"]))

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


def _plugin_settings(plugin: Any) -> dict[str, Any]:
    """The ``plugin_kwargs`` a plugin (its ``to_kwargs()``) or a mapping stands for."""
    settings = dict(plugin.to_kwargs() if hasattr(plugin, "to_kwargs") else plugin)
    unknown = set(settings) - set(_PLUGIN_FALLBACKS)
    if unknown:
        raise ValueError(
            f"Unknown gradient accumulation settings {sorted(unknown)} in "
            f"gradient_accumulation_plugin={plugin!r}; accepted: {sorted(_PLUGIN_FALLBACKS)}."
        )
    return settings
