"""One FSDP model and its optimizers as a sharded state inside an accel-ckpt checkpoint folder.

``SHARDED_STATE_DICT``: every rank writes its own shards with ``torch.distributed.checkpoint``
(``model.*`` and ``optimizer.*`` entries); loading reshards onto any number of processes.
``FULL_STATE_DICT``: rank 0 writes the gathered weights (``model.safetensors``) and optimizer
state (``optimizer.pt``, tensors only, read with ``weights_only=True``); on load every rank reads
them from the shared checkpoint folder and keeps its own shards.

Planning goes through accel-ckpt's :mod:`accel_ckpt.dcp_planning`: the global save plan is
validated in O(chunks log chunks) and, where torch caches save plans, reused by the next save of
the same model with the same layout; each rank finds the saved chunks it loads by binary search,
with the current key format only.

``save_state(blocking=False)``: :meth:`FSDPModelState.stage` copies this rank's shards (or, for a
full state, rank 0's gathered tensors) into host buffers kept per model between saves, and the
returned write runs ``torch.distributed.checkpoint.save`` on the background thread over the
checkpoint's gloo group, so it never interleaves with the training loop's collectives.
"""

from __future__ import annotations

import dataclasses
import pathlib
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from accel.errors import AcceleratorConfigError
from accel_ckpt import StagedWrite
from accel_ckpt.async_save import register_staging_release

MODEL_KEY = "model"
OPTIMIZER_KEY = "optimizer"
FULL_MODEL_FILE = "model.safetensors"
FULL_OPTIMIZER_FILE = "optimizer.pt"


def restore_param_group_settings(
    optimizers: Sequence[torch.optim.Optimizer], saved_groups: Sequence[Mapping[str, Any]]
) -> None:
    """Set each param group's hyperparameters (``lr``, ``momentum``...) to the saved group's.

    The saved groups are those of ``optimizers`` in order, as torch's full optimizer state dict
    lists them; their ``params`` (parameter names there) are left alone.
    """
    groups = [group for optimizer in optimizers for group in optimizer.param_groups]
    if len(groups) != len(saved_groups):
        raise AcceleratorConfigError(
            f"the checkpoint's optimizer state has {len(saved_groups)} param groups but the "
            f"prepared optimizers have {len(groups)}; load it into optimizers built like the "
            "ones that saved it"
        )
    for group, saved in zip(groups, saved_groups, strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})


def require_numpy() -> None:
    """Refuse a sharded save or load early when numpy is missing.

    ``torch.distributed.checkpoint`` exchanges its plans with object collectives, which need
    numpy (torch does not depend on it); without it they fail deep inside, on every rank.

    Raises:
        AcceleratorConfigError: numpy is not installed.
    """
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise AcceleratorConfigError(
            "fsdp_state_dict_type=SHARDED_STATE_DICT: save_state/load_state go through "
            "torch.distributed.checkpoint, whose object collectives need numpy, which is not "
            "installed. Install it: pip install 'accel[fsdp]' (or pip install numpy)."
        ) from None


def off_cpu(model: torch.nn.Module) -> bool:
    """Whether the model's parameters live on an accelerator (then full states are offloaded).

    On the CPU they stay where they are: FSDP1's rank-0 CPU offload of tensors that are on the
    CPU already crashes (segmentation fault, torch 2.13 on gloo).
    """
    return any(parameter.device.type != "cpu" for parameter in model.parameters())


# Host copies of each model's sharded state, reused by the next asynchronous save (same keys,
# shapes and dtypes) so that staging copies into memory already mapped instead of page-faulting.
_STAGED: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()


def release_staged() -> None:
    """Free the host copies kept for asynchronous sharded saves."""
    _STAGED.clear()


def host_copy(state: dict[str, Any], cached: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of ``state`` (tensors, DTensors, ShardedTensors) in host memory (pinned for GPUs).

    Args:
        state: The state dict to copy.
        cached: A previous copy to copy into when it has the same structure, shapes and dtypes.

    Returns:
        The copy: its tensors are ``cached``'s when reused, its other values ``state``'s.
    """
    from torch.distributed._state_dict_utils import (
        _check_state_dict_similarity,
        _copy_state_dict,
        _create_cpu_state_dict,
    )

    on_cuda = any(t.device.type == "cuda" for t in _tensors(state))
    if cached is None or not _check_state_dict_similarity(state, cached):
        # Pinned host memory for GPU shards: the copy runs at full PCIe speed, without staging.
        cached = _create_cpu_state_dict(state, pin_memory=on_cuda and torch.cuda.is_available())
    copied = _copy_state_dict(state, cached, non_blocking=on_cuda, type_check=False)
    if on_cuda:
        torch.cuda.synchronize()  # pragma: no cover - CPU in CI
    return copied


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for item in value.values() for t in _tensors(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def raw_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside accel's ``AcceleratedOptimizer`` (or ``optimizer`` itself)."""
    return getattr(optimizer, "optimizer", optimizer)  # type: ignore[no-any-return]


def model_optimizers(
    model: torch.nn.Module, optimizers: Sequence[Any], claimed: set[int]
) -> list[torch.optim.Optimizer]:
    """The optimizers stepping any of ``model``'s parameters, as torch optimizers.

    Their ids are added to ``claimed`` (the optimizers left unclaimed are saved whole). An
    optimizer stepping several models belongs to each of their states.
    """
    own = {id(parameter) for parameter in model.parameters()}
    mine = [
        optimizer
        for optimizer in optimizers
        if any(
            id(parameter) in own
            for group in raw_optimizer(optimizer).param_groups
            for parameter in group["params"]
        )
    ]
    claimed.update(id(optimizer) for optimizer in mine)
    return [raw_optimizer(optimizer) for optimizer in mine]


@dataclasses.dataclass
class FSDPModelState:
    """``accel_ckpt.ShardedState`` for one FSDP model (FSDP1 or FSDP2) and its optimizers.

    Attributes:
        name: Subfolder of the checkpoint (``fsdp_model_<i>``).
        model: The sharded model.
        optimizers: The raw optimizers stepping its parameters.
        full: Write gathered tensors from rank 0 instead of per-rank shards.
        trainable_only: Write and read the trainable parameters only (a PEFT model's adapters;
            the frozen base weights stay as they are).
    """

    name: str
    model: torch.nn.Module
    optimizers: list[torch.optim.Optimizer]
    full: bool = False
    trainable_only: bool = False

    def _state(self, full: bool) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_state_dict,
        )

        offload = full and off_cpu(self.model)
        options = StateDictOptions(
            full_state_dict=full, cpu_offload=offload, ignore_frozen_params=self.trainable_only
        )
        if not self.optimizers:
            return {MODEL_KEY: get_model_state_dict(self.model, options=options)}
        model_state, optimizer_state = get_state_dict(self.model, self.optimizers, options=options)
        return {MODEL_KEY: model_state, OPTIMIZER_KEY: optimizer_state}

    def _apply(self, state: dict[str, Any], full: bool) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_state_dict,
        )

        options = StateDictOptions(full_state_dict=full, strict=not self.trainable_only)
        if not self.optimizers:
            set_model_state_dict(self.model, state[MODEL_KEY], options=options)
            return
        if full and not state[OPTIMIZER_KEY].get("state"):
            # Optimizers without per-parameter state (SGD without momentum): torch's full
            # optimizer load finds no tensor to learn the device from and fails, and there is
            # nothing to reshard; only the hyperparameters of the param groups come back.
            set_model_state_dict(self.model, state[MODEL_KEY], options=options)
            restore_param_group_settings(self.optimizers, state[OPTIMIZER_KEY]["param_groups"])
            return
        set_state_dict(
            self.model,
            self.optimizers,
            model_state_dict=state[MODEL_KEY],
            optim_state_dict=state[OPTIMIZER_KEY],
            options=options,
        )

    def save(self, folder: pathlib.Path) -> dict[str, tuple[int, int]] | None:
        """Write this model's state into ``folder`` (collective: call on every rank).

        Returns:
            For a sharded save, the size and CRC-32 of each file this rank wrote (hashed while
            writing, so the committing rank need not read every shard back); ``None`` for a
            full one.
        """
        if self.full:
            self._save_full(folder)
            return None
        require_numpy()
        from torch.distributed.checkpoint.state_dict_saver import save

        from accel_ckpt.dcp_writer import checksummed_writer

        writer = checksummed_writer(folder)
        save(self._state(full=False), storage_writer=writer, planner=self._save_planner(None))
        return writer.records

    def _save_planner(self, group: Any) -> Any:
        """A save planner whose cached plans belong to this model, rank and world size.

        torch keeps cached plans per process for its lifetime: a process that takes another
        rank or world size (a reused worker, a resized group) must not reuse the old ones.
        """
        from accel_ckpt.dcp_planning import ScalableSavePlanner

        place = f"{dist.get_rank(group)}of{dist.get_world_size(group)}"
        return ScalableSavePlanner(cache_key=f"{self.name}/{place}")

    def stage(self) -> StagedWrite:
        """Copy this rank's part into host memory now; return the write (collective).

        Returns:
            ``write(folder, process_group)``, which writes the copy as :meth:`save` would, with
            ``torch.distributed.checkpoint``'s collectives on ``process_group``.
        """
        if self.full:
            state = self._state(full=True)
            if dist.get_rank() != 0:
                return lambda folder, group: None
            full = host_copy(state)
            return lambda folder, group: self._write_full(folder, full)
        require_numpy()
        state = self._state(full=False)
        staged = host_copy(state, _STAGED.get(self.model))
        _STAGED[self.model] = staged
        register_staging_release(release_staged)

        def write(folder: pathlib.Path, group: Any) -> dict[str, tuple[int, int]]:
            from torch.distributed.checkpoint.state_dict_saver import save

            from accel_ckpt.dcp_writer import checksummed_writer

            writer = checksummed_writer(folder)
            planner = self._save_planner(group)
            save(staged, storage_writer=writer, process_group=group, planner=planner)
            return writer.records

        return write

    def load(self, folder: pathlib.Path) -> None:
        """Read the state saved in ``folder`` into the model and optimizers (collective)."""
        if (folder / FULL_MODEL_FILE).exists():
            self._load_full(folder)
            return
        require_numpy()
        from torch.distributed.checkpoint.state_dict_loader import load

        from accel_ckpt.containment import check_dcp_paths
        from accel_ckpt.dcp_planning import ScalableLoadPlanner

        check_dcp_paths(folder)
        state = self._state(full=False)
        load(state, checkpoint_id=folder, planner=ScalableLoadPlanner())
        self._apply(state, full=False)

    def _save_full(self, folder: pathlib.Path) -> None:
        state = self._state(full=True)
        if dist.get_rank() == 0:
            self._write_full(folder, state)
        # No barrier here: accel-ckpt's save protocol exchanges every process's outcome right
        # after this call, so an error on rank 0 (a refused tensor, a full disk) reaches every
        # rank instead of leaving the others waiting in a barrier rank 0 never enters.

    @staticmethod
    def _write_full(folder: pathlib.Path, state: dict[str, Any]) -> None:
        """Rank 0: the gathered weights as safetensors, the optimizer state as tensors only."""
        from accel_ckpt.pickle_io import save_pickled
        from accel_ckpt.safetensors_io import write_safetensors

        folder.mkdir(parents=True, exist_ok=True)
        write_safetensors(folder / FULL_MODEL_FILE, state[MODEL_KEY], {})
        if OPTIMIZER_KEY in state:
            save_pickled(state[OPTIMIZER_KEY], folder / FULL_OPTIMIZER_FILE)

    def _load_full(self, folder: pathlib.Path) -> None:
        """Rank 0 reads the gathered files and broadcasts them; every rank keeps its own shards.

        An error reading them on rank 0 (a missing or damaged file) is raised on every rank.
        """
        from accel_ckpt.pickle_io import load_pickled
        from accel_ckpt.safetensors_io import read_safetensors
        from accel_ckpt.shared_read import SharedReads, read_once

        sharing = SharedReads.current()
        model_file, optimizer_file = folder / FULL_MODEL_FILE, folder / FULL_OPTIMIZER_FILE
        state: dict[str, Any] = {
            MODEL_KEY: read_once(
                sharing, lambda: dict(read_safetensors(model_file).tensors), str(model_file)
            )
        }
        if self.optimizers:
            state[OPTIMIZER_KEY] = read_once(
                sharing, lambda: load_pickled(optimizer_file), str(optimizer_file)
            )
        self._apply(state, full=True)
