"""``Checkpointer``: settings, hooks and registered objects in one place, for the Accelerator."""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from accel_ckpt.async_save import AsyncSave, wait_for_pending_saves
from accel_ckpt.errors import CheckpointNotFoundError
from accel_ckpt.model_io import save_model
from accel_ckpt.project import ProjectConfiguration
from accel_ckpt.sharded_state import ShardedState
from accel_ckpt.state_reader import resolve_input_dir
from accel_ckpt.stateful import LoadHook, SaveHook
from accel_ckpt.training_objects import TrainingObjects
from accel_ckpt.training_state import LoadedCheckpoint, load_state, save_state

PathLike = str | os.PathLike[str]


class Checkpointer:
    """Saves and loads training state with fixed settings, hooks and registered objects.

    Args:
        project_config: Naming, ``total_limit``, ``iteration``, ``save_on_each_node``.
        safe_serialization: Model weights as safetensors (default) or ``.bin``.
        unwrap: Custom model unwrapping function (e.g. the Accelerator's ``unwrap_model``).
        allow_pickle: Store and load states that need pickle (trusted files only).

    Example:
        >>> ckpt = Checkpointer(ProjectConfiguration("runs/a", automatic_checkpoint_naming=True))
        >>> ckpt.save_state(models=[model], optimizers=[optimizer])  # doctest: +SKIP
        >>> ckpt.load_state(models=[model], optimizers=[optimizer])  # doctest: +SKIP

    """

    def __init__(
        self,
        project_config: ProjectConfiguration | None = None,
        *,
        safe_serialization: bool = True,
        unwrap: Callable[[nn.Module], nn.Module] | None = None,
        allow_pickle: bool = False,
    ) -> None:
        self.project_config = project_config or ProjectConfiguration()
        self.safe_serialization = safe_serialization
        self.unwrap = unwrap
        self.allow_pickle = allow_pickle
        #: What a save covers when a call does not name the objects (the Accelerator fills it).
        self.objects = TrainingObjects()
        self._save_hooks: collections.OrderedDict[int, SaveHook] = collections.OrderedDict()
        self._load_hooks: collections.OrderedDict[int, LoadHook] = collections.OrderedDict()

    @property
    def custom_objects(self) -> list[Any]:
        """The registered objects (``register_for_checkpointing``), in order."""
        return self.objects.custom_objects

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Add objects with ``state_dict``/``load_state_dict`` to every save and load.

        Raises:
            InvalidArgumentError: An object lacks those methods (the message names each one).
        """
        self.objects.register(*objects)

    def register_save_state_pre_hook(self, hook: SaveHook) -> RemovableHandle:
        """Call ``hook(models, weights, folder)`` before each save; ``handle.remove()`` undoes it."""
        handle = RemovableHandle(self._save_hooks)
        self._save_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: LoadHook) -> RemovableHandle:
        """Call ``hook(models, folder)`` before each load; ``handle.remove()`` undoes it."""
        handle = RemovableHandle(self._load_hooks)
        self._load_hooks[handle.id] = hook
        return handle

    def save_state(
        self,
        output_dir: PathLike | None = None,
        *,
        models: Sequence[nn.Module] | None = None,
        optimizers: Sequence[Any] | None = None,
        schedulers: Sequence[Any] | None = None,
        dataloaders: Sequence[Any] | None = None,
        scaler: Any = None,
        sharded_states: Sequence[ShardedState] = (),
        blocking: bool = True,
        safe_serialization: bool | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Path | AsyncSave:
        """:func:`accel_ckpt.save_state` with this checkpointer's settings and objects.

        A kind of object not given is taken from :attr:`objects`.
        """
        options: dict[str, Any] = {
            **self._objects_or(models, optimizers, schedulers, dataloaders),
            "scaler": scaler,
            "custom_objects": self.custom_objects,
            "sharded_states": sharded_states,
            "project_config": self.project_config,
            "safe_serialization": (
                self.safe_serialization if safe_serialization is None else safe_serialization
            ),
            "save_hooks": list(self._save_hooks.values()),
            "unwrap": self.unwrap,
            "allow_pickle": self.allow_pickle,
            "metadata": metadata,
        }
        if blocking:
            return save_state(output_dir, blocking=True, **options)
        return save_state(output_dir, blocking=False, **options)

    def load_state(
        self,
        input_dir: PathLike | None = None,
        *,
        models: Sequence[nn.Module] | None = None,
        optimizers: Sequence[Any] | None = None,
        schedulers: Sequence[Any] | None = None,
        dataloaders: Sequence[Any] | None = None,
        scaler: Any = None,
        sharded_states: Sequence[ShardedState] = (),
        strict: bool = True,
        map_location: Any = None,
        allow_pickle: bool | None = None,
    ) -> LoadedCheckpoint:
        """:func:`accel_ckpt.load_state` with this checkpointer's settings and objects.

        ``allow_pickle`` overrides the checkpointer's setting for this call. A kind of object not
        given is taken from :attr:`objects`.
        """
        objects = self._objects_or(models, optimizers, schedulers, dataloaders)
        return load_state(
            input_dir,
            models=objects["models"],
            optimizers=objects["optimizers"],
            schedulers=objects["schedulers"],
            dataloaders=objects["dataloaders"],
            scaler=scaler,
            custom_objects=self.custom_objects,
            sharded_states=sharded_states,
            project_config=self.project_config,
            strict=strict,
            map_location=map_location,
            load_hooks=list(self._load_hooks.values()),
            unwrap=self.unwrap,
            allow_pickle=self.allow_pickle if allow_pickle is None else allow_pickle,
        )

    def _objects_or(
        self,
        models: Sequence[nn.Module] | None,
        optimizers: Sequence[Any] | None,
        schedulers: Sequence[Any] | None,
        dataloaders: Sequence[Any] | None,
    ) -> dict[str, Sequence[Any]]:
        """Each kind given, else the registry's list of that kind."""
        objects = self.objects
        return {
            "models": objects.models if models is None else models,
            "optimizers": objects.optimizers if optimizers is None else optimizers,
            "schedulers": objects.schedulers if schedulers is None else schedulers,
            "dataloaders": objects.dataloaders if dataloaders is None else dataloaders,
        }

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint ``load_state()`` without a folder loads, or None when there is none yet.

        That is the newest complete ``checkpoint_<i>`` under ``project_dir/checkpoints`` (one
        whose save was interrupted is skipped). With it a script resumes the same way on its
        first start and on every restart::

            if checkpointer.latest_checkpoint() is not None:
                checkpointer.load_state(models=[model], optimizers=[optimizer])

        Every process must see the same folder (a shared file system), or they disagree.

        Raises:
            InvalidArgumentError: Automatic checkpoint naming is off (then no folder is "newest").
        """
        try:
            return resolve_input_dir(None, self.project_config)
        except CheckpointNotFoundError:
            return None

    def save_model(
        self,
        model: nn.Module,
        save_directory: PathLike,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
        state_dict: Mapping[str, torch.Tensor] | None = None,
    ) -> list[Path]:
        """:func:`accel_ckpt.save_model` with this checkpointer's unwrapping."""
        return save_model(
            model,
            save_directory,
            max_shard_size,
            safe_serialization,
            state_dict=state_dict,
            unwrap=self.unwrap,
        )

    @staticmethod
    def wait() -> None:
        """Join background saves of this process, raising the first failure."""
        wait_for_pending_saves()
