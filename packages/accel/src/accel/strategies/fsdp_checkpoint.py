"""One FSDP model and its optimizers as a sharded state inside an accel-ckpt checkpoint folder.

``SHARDED_STATE_DICT``: every rank writes its own shards with ``torch.distributed.checkpoint``
(``model.*`` and ``optimizer.*`` entries); loading reshards onto any number of processes.
``FULL_STATE_DICT``: rank 0 writes the gathered weights (``model.safetensors``) and optimizer
state (``optimizer.pt``, tensors only, read with ``weights_only=True``); on load every rank reads
them from the shared checkpoint folder and keeps its own shards.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import torch
import torch.distributed as dist

from accel.errors import AcceleratorConfigError

MODEL_KEY = "model"
OPTIMIZER_KEY = "optimizer"
FULL_MODEL_FILE = "model.safetensors"
FULL_OPTIMIZER_FILE = "optimizer.pt"


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
        save(self._state(full=False), storage_writer=writer)
        return writer.records

    def load(self, folder: pathlib.Path) -> None:
        """Read the state saved in ``folder`` into the model and optimizers (collective)."""
        if (folder / FULL_MODEL_FILE).exists():
            self._load_full(folder)
            return
        require_numpy()
        from torch.distributed.checkpoint.state_dict_loader import load

        from accel_ckpt.containment import check_dcp_paths

        check_dcp_paths(folder)
        state = self._state(full=False)
        load(state, checkpoint_id=folder)
        self._apply(state, full=False)

    def _save_full(self, folder: pathlib.Path) -> None:
        from accel_ckpt.pickle_io import save_pickled
        from accel_ckpt.safetensors_io import write_safetensors

        state = self._state(full=True)
        if dist.get_rank() == 0:
            folder.mkdir(parents=True, exist_ok=True)
            write_safetensors(folder / FULL_MODEL_FILE, state[MODEL_KEY], {})
            if OPTIMIZER_KEY in state:
                save_pickled(state[OPTIMIZER_KEY], folder / FULL_OPTIMIZER_FILE)
        # No barrier here: accel-ckpt's save protocol exchanges every process's outcome right
        # after this call, so an error on rank 0 (a refused tensor, a full disk) reaches every
        # rank instead of leaving the others waiting in a barrier rank 0 never enters.

    def _load_full(self, folder: pathlib.Path) -> None:
        """Every rank reads the gathered files (shared filesystem) and keeps its own shards."""
        from safetensors.torch import load_file

        state: dict[str, Any] = {MODEL_KEY: load_file(str(folder / FULL_MODEL_FILE))}
        if self.optimizers:
            state[OPTIMIZER_KEY] = torch.load(folder / FULL_OPTIMIZER_FILE, weights_only=True)
        self._apply(state, full=True)
