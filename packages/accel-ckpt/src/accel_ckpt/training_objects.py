"""The objects one training state covers, in one registry, named as a checkpoint names them.

The Accelerator fills a :class:`TrainingObjects` in ``prepare()`` (models, optimizers, schedulers,
dataloaders) and ``register_for_checkpointing()`` (custom objects). ``save_state``/``load_state``,
the :class:`~accel_ckpt.Checkpointer` and replica-group healing all read this one registry, so the
list of what a checkpoint holds is written once.

Example:
    >>> objects = TrainingObjects()
    >>> objects.add(model)  # doctest: +SKIP
    >>> objects.add(optimizer)  # doctest: +SKIP
    >>> sorted(objects.named())  # doctest: +SKIP
    ['model', 'optimizer']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from torch import nn

from accel_ckpt.errors import CheckpointContentsError, InvalidArgumentError
from accel_ckpt.stateful import Stateful, numbered

#: A kind of object, as the checkpoint files name it (``model``, ``model_1``...).
Kind = Literal["model", "optimizer", "scheduler", "dataloader", "custom_checkpoint"]
KINDS: tuple[Kind, ...] = ("model", "optimizer", "scheduler", "dataloader", "custom_checkpoint")
#: The kinds ``prepare()`` fills (custom objects are registered instead).
PREPARED_KINDS: tuple[Kind, ...] = KINDS[:4]


class TrainingObjects:
    """Every object a training state covers, by kind, in the order they were added.

    Attributes:
        models: Prepared models.
        optimizers: Prepared optimizers.
        schedulers: Prepared learning-rate schedulers.
        dataloaders: Prepared dataloaders (their position is part of the state).
        custom_objects: Objects registered with ``register_for_checkpointing``.
    """

    def __init__(self) -> None:
        self.models: list[nn.Module] = []
        self.optimizers: list[Any] = []
        self.schedulers: list[Any] = []
        self.dataloaders: list[Any] = []
        self.custom_objects: list[Any] = []

    def of_kind(self, kind: Kind) -> list[Any]:
        """The list holding objects of ``kind``.

        Raises:
            InvalidArgumentError: ``kind`` is not one of :data:`KINDS`.
        """
        lists: dict[str, list[Any]] = {
            "model": self.models,
            "optimizer": self.optimizers,
            "scheduler": self.schedulers,
            "dataloader": self.dataloaders,
            "custom_checkpoint": self.custom_objects,
        }
        try:
            return lists[kind]
        except KeyError:
            raise InvalidArgumentError(
                f"kind={kind!r} is not a kind of training object; use one of {list(KINDS)}."
            ) from None

    def register(self, *objects: Any) -> None:
        """Add custom objects (each with ``state_dict``/``load_state_dict``) to the state.

        Raises:
            InvalidArgumentError: An object lacks those methods (the message lists each one).
        """
        bad = [
            f"- Item at index {index}, `{type(obj).__name__}`"
            for index, obj in enumerate(objects)
            if not isinstance(obj, Stateful)
        ]
        if bad:
            lines = "\n".join(bad)
            raise InvalidArgumentError(
                "All `objects` must include a `state_dict` and `load_state_dict` function to be "
                f"stored. The following inputs are invalid:\n{lines}\nWrap each in an object "
                "with state_dict() and load_state_dict(), or save it yourself."
            )
        self.custom_objects.extend(objects)

    def replace(self, before: Any, after: Any) -> None:
        """Put ``after`` wherever ``before`` is held (a strategy replaced a prepared object)."""
        for kind in PREPARED_KINDS:
            held = self.of_kind(kind)
            for index, obj in enumerate(held):
                if obj is before:
                    held[index] = after

    def clear(self) -> None:
        """Forget every prepared object (``free_memory``); registered custom objects stay."""
        for kind in PREPARED_KINDS:
            self.of_kind(kind).clear()

    def named(self, kinds: Iterable[Kind] = KINDS) -> dict[str, Any]:
        """The objects of ``kinds`` by their checkpoint names (``model``, ``model_1``...)."""
        return {
            numbered(kind, index): obj
            for kind in kinds
            for index, obj in enumerate(self.of_kind(kind))
        }

    def state_dict(self, kinds: Iterable[Kind] = KINDS) -> dict[str, Any]:
        """Every object's ``state_dict()`` of ``kinds``, by name (an in-memory copy of the state)."""
        return {name: obj.state_dict() for name, obj in self.named(kinds).items()}

    def load_state_dict(self, state: Mapping[str, Any], kinds: Iterable[Kind] = KINDS) -> None:
        """Load ``state`` (from :meth:`state_dict`) into the objects of ``kinds``.

        Raises:
            CheckpointContentsError: The names differ from this registry's (another set of
                objects was prepared); nothing is loaded then.
        """
        named = self.named(kinds)
        if set(named) != set(state):
            missing = sorted(set(named) - set(state))
            extra = sorted(set(state) - set(named))
            raise CheckpointContentsError(
                f"the training state holds {sorted(state)} but this process prepared "
                f"{sorted(named)} (missing: {missing}, unexpected: {extra}); prepare the same "
                "models, optimizers and schedulers, in the same order, on every process."
            )
        for name, obj in named.items():
            obj.load_state_dict(state[name])


__all__ = ["KINDS", "PREPARED_KINDS", "Kind", "TrainingObjects"]
