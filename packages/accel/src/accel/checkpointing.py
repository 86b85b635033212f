"""The Accelerator's checkpoint methods, delegated to accel-ckpt's ``Checkpointer``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from accel.errors import AcceleratorConfigError
from accel.job_facts import JobFactsMixin
from accel.precision import Precision
from accel.strategies.base import ModelStrategy
from accel_ckpt import AsyncSave, Checkpointer, ProjectConfiguration, TrainingObjects
from accel_ckpt import load as load_object
from accel_ckpt import save as save_object
from accel_ckpt import save_model as save_model_weights
from accel_ckpt.accelerator_state_io import (
    load_accelerator_state,
    loading_options,
    save_accelerator_state,
)
from accel_ckpt.training_objects import Kind
from accel_ops.records import record

PathLike = str | os.PathLike[str]

# Accelerate's module-level checkpoint functions, implemented in accel-ckpt.
__reexported__ = (load_accelerator_state, save_accelerator_state)


def make_project_configuration(
    project_dir: PathLike | None, project_config: ProjectConfiguration | None
) -> ProjectConfiguration:
    """The project configuration: the one given (with ``project_dir`` applied) or a new one."""
    config = project_config if project_config is not None else ProjectConfiguration()
    if project_dir is not None:
        config.set_directories(project_dir)
    return config


def _registry_list(kind: Kind) -> property:
    """An attribute that is the registry's list of ``kind``; assigning replaces its items."""

    def read(self: CheckpointingMixin) -> list[Any]:
        return self.training_objects.of_kind(kind)

    def replace(self: CheckpointingMixin, objects: list[Any]) -> None:
        self.training_objects.of_kind(kind)[:] = objects

    return property(read, replace)


class CheckpointingMixin(JobFactsMixin):
    """``save_model``, ``save``, ``save_state``, ``load_state`` and registration, for the Accelerator.

    The host class provides ``checkpointer`` (whose :class:`~accel_ckpt.TrainingObjects` is the
    one registry of what a state covers), ``project_configuration``, ``step``, ``scaler`` and
    ``unwrap_model``; the facts come from :class:`JobFactsMixin`.
    """

    checkpointer: Checkpointer
    strategy: ModelStrategy
    precision: Precision
    project_configuration: ProjectConfiguration
    step: int
    scaler: Any
    replica_training: Any  # accel.replica_training.ReplicaGroupTraining | None

    @property
    def training_objects(self) -> TrainingObjects:
        """Every object the training state covers (filled by ``prepare`` and registration)."""
        return self.checkpointer.objects

    # Accelerate's private names for the same lists (scripts and libraries read them).
    _models = _registry_list("model")
    _optimizers = _registry_list("optimizer")
    _schedulers = _registry_list("scheduler")
    _dataloaders = _registry_list("dataloader")

    def _plain_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model without any wrapper (the Accelerator overrides this)."""
        raise NotImplementedError

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Include objects with ``state_dict``/``load_state_dict`` in every save and load.

        Raises:
            accel_ckpt.InvalidArgumentError: An object lacks those methods (the message names it).
        """
        self.checkpointer.register_for_checkpointing(*objects)

    @property
    def _custom_objects(self) -> list[Any]:
        return self.training_objects.custom_objects

    def register_save_state_pre_hook(
        self, hook: Callable[[list[torch.nn.Module], list[dict[str, Any]], str], None]
    ) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` before each ``save_state``."""
        return self.checkpointer.register_save_state_pre_hook(hook)

    def register_load_state_pre_hook(
        self, hook: Callable[[list[torch.nn.Module], str], None]
    ) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` before each ``load_state``."""
        return self.checkpointer.register_load_state_pre_hook(hook)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: PathLike,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the model's full weights (main process), sharded above ``max_shard_size``.

        Call it on every process: a sharded model (FSDP, DeepSpeed ZeRO-3) is gathered first.
        """
        save_model_weights(
            self._plain_model(model),
            save_directory,
            max_shard_size=max_shard_size,
            safe_serialization=safe_serialization,
            state_dict=self.strategy.full_state_dict(model),
            is_main_process=self.is_main_process,
        )

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's complete state dict, gathered when the model is sharded.

        Call it on every process (gathering is a collective).

        Args:
            model: A prepared model.
            unwrap: Keys of the user's module (default); False gives the state dict of the
                outermost wrapper as it is, keys such as ``module.`` prefixes included.
        """
        if not unwrap:
            self.strategy.settle(model)
            return model.state_dict()
        return self.strategy.full_state_dict(model)

    def save(self, obj: Any, f: PathLike, safe_serialization: bool = False) -> None:
        """Write ``obj`` to ``f`` once (main process, or each machine's with ``save_on_each_node``)."""
        save_object(
            obj,
            f,
            save_on_each_node=self.project_configuration.save_on_each_node,
            safe_serialization=safe_serialization,
        )

    def save_state(
        self,
        output_dir: PathLike | None = None,
        safe_serialization: bool = True,
        blocking: bool = True,
    ) -> Path | AsyncSave:
        """Save the whole training state (call on every process).

        That is every prepared model, optimizer, scheduler and dataloader position, the grad
        scaler, registered objects and every process's RNG states.

        Args:
            output_dir: Checkpoint folder; with automatic naming,
                ``project_dir/checkpoints/checkpoint_<i>``.
            safe_serialization: Model weights as safetensors (else ``.bin``).
            blocking: False copies the state to CPU memory and writes in the background; the
                returned handle's ``wait()`` (or the next save/load) joins it.

        Returns:
            The checkpoint folder (a ``pathlib.Path``, as Accelerate returns), or the background
            save's handle.
        """
        replicas = self.replica_training
        if replicas is not None:  # one group writes; the others check it did
            saved: Path | AsyncSave = replicas.save_in_one_group(
                write=lambda: self._write_state(output_dir, safe_serialization, blocking),
                saved_elsewhere=lambda: self._folder_saved_by_another_group(output_dir),
            )
            return saved
        return self._write_state(output_dir, safe_serialization, blocking)

    def _write_state(
        self, output_dir: PathLike | None, safe_serialization: bool, blocking: bool
    ) -> Path | AsyncSave:
        """Write the training state from this process (the body of :meth:`save_state`)."""
        with record("save_state"):  # a process that saves alone is named in the timeout error
            models, optimizers, sharded = self.strategy.checkpoint_split(
                self._models, self._optimizers
            )
            return self.checkpointer.save_state(
                output_dir,
                models=models,
                optimizers=optimizers,
                sharded_states=sharded,
                scaler=self.scaler,
                blocking=blocking,
                safe_serialization=safe_serialization,
                metadata={"step": self.step, **self.strategy.checkpoint_metadata(self._models)},
            )

    def _folder_saved_by_another_group(self, output_dir: PathLike | None) -> Path:
        """Where another replica group saves this state (it is written there once, not here)."""
        config = self.project_configuration
        if config.automatic_checkpoint_naming:
            folder = config.checkpoint_dir()
            config.iteration += 1
            return folder
        if output_dir is None:
            raise AcceleratorConfigError(
                "save_state needs output_dir, or project_config=ProjectConfiguration("
                "project_dir=..., automatic_checkpoint_naming=True)."
            )
        return Path(output_dir)

    def load_state(
        self,
        input_dir: PathLike | None = None,
        load_kwargs: dict[str, Any] | None = None,
        strict: bool = True,
        allow_pickle: bool = False,
        **load_model_func_kwargs: Any,
    ) -> None:
        """Restore what :meth:`save_state` saved into the prepared objects (call on every process).

        Also imports a folder written by Hugging Face Accelerate's ``save_state``, to switch
        libraries mid-training; its pickled files are only read with ``allow_pickle=True``.

        Args:
            input_dir: Checkpoint folder; ``None`` takes the newest complete automatically named one.
            load_kwargs: ``torch.load`` arguments for the pickled states, as in Accelerate:
                ``map_location`` and ``weights_only`` (``False`` is ``allow_pickle=True``).
            strict: Model keys must match exactly.
            allow_pickle: Trust pickled files (``.bin``/``.pkl``, which can run code when loaded):
                those of an Accelerate checkpoint, or states saved with pickle. Default: refuse.
            **load_model_func_kwargs: Arguments of the model loading function; accel's takes
                ``strict`` only (given here or above).

        Raises:
            AcceleratorConfigError: An argument of ``load_kwargs`` or ``load_model_func_kwargs``
                that accel's loader does not take.
        """
        map_location, allow_pickle, strict = loading_options(
            "load_state",
            load_kwargs,
            load_model_func_kwargs,
            allow_pickle=allow_pickle,
            strict=strict,
            error=AcceleratorConfigError,
        )
        with record("load_state"):
            models, optimizers, sharded = self.strategy.checkpoint_split(
                self._models, self._optimizers
            )
            folder = None
            if models and not sharded:
                # Models saved sharded (FSDP, a mesh) load into whole models too.
                from accel.strategies.fsdp.saved_shards import adopt_saved_shards
                from accel_ckpt import wait_for_pending_saves
                from accel_ckpt.state_reader import resolve_input_dir

                wait_for_pending_saves()
                folder = resolve_input_dir(input_dir, self.project_configuration)
                models, optimizers, sharded = adopt_saved_shards(
                    folder, models, optimizers, sharded
                )
            loaded = self.checkpointer.load_state(
                input_dir if folder is None else folder,
                models=models,
                optimizers=optimizers,
                sharded_states=sharded,
                scaler=self.scaler,
                strict=strict,
                allow_pickle=allow_pickle,
                map_location=map_location,
            )
        self.step = int(loaded.metadata.get("step", 0))
        self.strategy.checkpoint_metadata_loaded(self._models, loaded.metadata)
        self.precision.state_loaded()

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint ``load_state()`` without a folder loads; None before the first save.

        The newest complete ``checkpoint_<i>`` under ``project_dir/checkpoints`` (needs
        ``ProjectConfiguration(automatic_checkpoint_naming=True)``); one whose save was
        interrupted is skipped. The restart pattern, the same on a first start and on every
        restart or relaunch::

            accelerator.register_for_checkpointing(progress)  # where the loop stands
            if accelerator.latest_checkpoint() is not None:
                accelerator.load_state()

        Every process must see the same folder (a shared file system).
        """
        return self.checkpointer.latest_checkpoint()


def save_custom_state(
    obj: Any, path: str | os.PathLike[str], index: int = 0, save_on_each_node: bool = False
) -> None:
    """Write ``obj.state_dict()`` to ``{path}/custom_checkpoint_{index}.pkl`` (Accelerate's layout).

    Args:
        obj: An object with ``state_dict()``.
        path: The checkpoint folder.
        index: The object's position among the registered ones.
        save_on_each_node: Write once per machine instead of once per job.
    """
    save_object(
        obj.state_dict(),
        Path(path) / f"custom_checkpoint_{index}.pkl",
        save_on_each_node=save_on_each_node,
    )


def load_custom_state(obj: Any, path: str | os.PathLike[str], index: int = 0) -> None:
    """Load ``{path}/custom_checkpoint_{index}.pkl`` into ``obj.load_state_dict``.

    The file is read with PyTorch's restricted unpickler (accel loads safely by default); a
    state holding other classes raises ``accel_ckpt.UnsafeCheckpointError`` naming them.
    """
    obj.load_state_dict(
        load_object(Path(path) / f"custom_checkpoint_{index}.pkl", map_location="cpu")
    )
