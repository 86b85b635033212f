"""Accelerate's ``save_accelerator_state`` / ``load_accelerator_state``, on accel's checkpoints.

They are the functions ``Accelerator.save_state``/``load_state`` call in Accelerate, with its
argument lists; here they write and read accel's checkpoint format (:func:`save_state` /
:func:`load_state`: atomic, with a manifest and checksums), or import an Accelerate folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from accel_ckpt.errors import InvalidArgumentError
from accel_ckpt.training_state import load_state, save_state

PathLike = str | os.PathLike[str]


class _HeldStateDict(nn.Module):
    """A module whose ``state_dict()`` is a state dict given in advance (for saving only)."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        super().__init__()
        self._held = dict(state)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return dict(self._held)


def save_accelerator_state(
    output_dir: PathLike,
    model_states: Sequence[Mapping[str, Any]],
    optimizers: Sequence[Any],
    schedulers: Sequence[Any],
    dataloaders: Sequence[Any],
    process_index: int,
    step: int,
    scaler: Any = None,
    save_on_each_node: bool = False,
    safe_serialization: bool = True,
) -> Path:
    """Save model states, optimizers, schedulers, dataloader positions, scaler and RNG states.

    Call it on every process (each writes its RNG states; the main process the rest).

    Args:
        output_dir: The checkpoint folder.
        model_states: The models' state dicts (e.g. ``accelerator.get_state_dict(model)``).
        optimizers: Optimizers.
        schedulers: LR schedulers.
        dataloaders: Dataloaders (those with ``state_dict()`` have their position saved).
        process_index: This process's rank (accel finds it itself; kept for the signature).
        step: The training step, returned by :func:`load_accelerator_state` as ``{"step": ...}``.
        scaler: A ``GradScaler``.
        save_on_each_node: Each machine's local main writes its own copy.
        safe_serialization: Model weights as safetensors (else ``pytorch_model.bin``).

    Returns:
        The checkpoint folder.
    """
    return save_state(
        output_dir,
        models=[_HeldStateDict(state) for state in model_states],
        optimizers=optimizers,
        schedulers=schedulers,
        dataloaders=dataloaders,
        scaler=scaler,
        save_on_each_node=save_on_each_node,
        safe_serialization=safe_serialization,
        metadata={"step": int(step)},
    )


#: The ``torch.load`` arguments accel's loaders take through Accelerate's ``load_kwargs``.
TORCH_LOAD_KEYS = ("map_location", "weights_only")


def loading_options(
    caller: str,
    load_kwargs: Mapping[str, Any] | None,
    model_kwargs: Mapping[str, Any],
    *,
    map_location: Any = None,
    allow_pickle: bool = False,
    strict: bool = True,
    error: type[Exception] = InvalidArgumentError,
) -> tuple[Any, bool, bool]:
    """``(map_location, allow_pickle, strict)`` from Accelerate-style loading arguments.

    Args:
        caller: The function the arguments were given to, for the error message.
        load_kwargs: Accelerate's ``torch.load`` arguments: ``map_location`` and ``weights_only``
            (``False`` means ``allow_pickle=True``).
        model_kwargs: Arguments of the model loading function; only ``strict`` is taken.
        map_location: The location when ``load_kwargs`` names none.
        allow_pickle: Whether pickled files are trusted unless ``weights_only=False`` says so.
        strict: ``strict`` unless ``model_kwargs`` gives it.
        error: The exception class raised (the caller's package's own).

    Raises:
        InvalidArgumentError: (or ``error``) an argument accel's loaders do not take.
    """
    options = dict(load_kwargs or {})
    unknown = sorted(set(options) - set(TORCH_LOAD_KEYS))
    if unknown:
        raise error(
            f"{caller}(load_kwargs={options!r}): accel's loader takes only "
            f"{list(TORCH_LOAD_KEYS)} from torch.load's arguments, not {unknown}; drop them."
        )
    extra = sorted(set(model_kwargs) - {"strict"})
    if extra:
        raise error(
            f"{caller}(**{ {key: model_kwargs[key] for key in extra} }): the model loading "
            "function takes only strict=; drop the others."
        )
    return (
        options.get("map_location", map_location),
        allow_pickle or options.get("weights_only") is False,
        bool(model_kwargs.get("strict", strict)),
    )


def load_accelerator_state(
    input_dir: PathLike,
    models: Sequence[nn.Module],
    optimizers: Sequence[Any],
    schedulers: Sequence[Any],
    dataloaders: Sequence[Any],
    process_index: int,
    scaler: Any = None,
    map_location: Any = None,
    load_kwargs: Mapping[str, Any] | None = None,
    **load_model_func_kwargs: Any,
) -> dict[str, Any]:
    """Load what :func:`save_accelerator_state` (or Accelerate's) saved into the given objects.

    Args:
        input_dir: The checkpoint folder.
        models: Models to fill in place.
        optimizers: Optimizers.
        schedulers: LR schedulers.
        dataloaders: Dataloaders (their saved positions are restored).
        process_index: This process's rank (accel finds it itself; kept for the signature).
        scaler: A ``GradScaler``.
        map_location: Device of the loaded tensors (``"on_device"``: left to each object).
        load_kwargs: ``torch.load`` arguments: ``map_location`` and ``weights_only``
            (``weights_only=False`` trusts pickled files, needed for Accelerate's folders).
        **load_model_func_kwargs: ``strict`` (default True).

    Returns:
        Attributes to restore on the Accelerator: ``{"step": <saved step>}``.

    Raises:
        InvalidArgumentError: An argument of ``load_kwargs`` or ``load_model_func_kwargs`` that
            accel's loader does not take.
    """
    location, allow_pickle, strict = loading_options(
        "load_accelerator_state", load_kwargs, load_model_func_kwargs, map_location=map_location
    )
    if location == "on_device":
        location = None
    loaded = load_state(
        input_dir,
        models=models,
        optimizers=optimizers,
        schedulers=schedulers,
        dataloaders=dataloaders,
        scaler=scaler,
        strict=strict,
        map_location=location,
        allow_pickle=allow_pickle,
    )
    return {"step": int(loaded.metadata.get("step", 0))}
