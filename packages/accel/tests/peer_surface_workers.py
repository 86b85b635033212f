"""Worker of test_peer_surface.py: what Accelerate's shipped test scripts rely on, on real ranks."""

from __future__ import annotations

import pathlib
import warnings

import torch
from safetensors.torch import load_file
from torch.distributed.fsdp import ShardingStrategy
from torch.utils.data import DataLoader, IterableDataset

from accel import Accelerator, FullyShardedDataParallelPlugin
from accel.commands.merge import merge_command, merge_command_parser
from accel.errors import StateResetError
from accel.state import AcceleratorState
from accel.utils import load_fsdp_model, merge_fsdp_weights, save_fsdp_model
from accel_state import DistributedType, reset_state


class Numbers(IterableDataset):
    def __iter__(self):
        yield from torch.arange(6.0)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))


def _train(accelerator: Accelerator, model: torch.nn.Module) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer = accelerator.prepare(model, optimizer)
    for step in range(3):
        inputs = torch.randn(4, 4, generator=torch.Generator().manual_seed(step))
        accelerator.backward(model(inputs).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()


def _fsdp_files(folder: pathlib.Path, state_dict_type: str) -> dict:
    """save_fsdp_model, merge (function and command), load_fsdp_model into a fresh model."""
    out: dict = {}
    plugin = FullyShardedDataParallelPlugin(
        sharding_strategy=ShardingStrategy.FULL_SHARD, state_dict_type=state_dict_type
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = accelerator.prepare(_model())
    out["fsdp_version"] = 2 if accelerator.is_fsdp2 else 1
    _train(accelerator, model)
    trained = {key: value.clone() for key, value in accelerator.get_state_dict(model).items()}
    out["keys"] = len(trained)
    written = save_fsdp_model(plugin, accelerator, model, folder)
    out["written"] = written.name
    if state_dict_type == "SHARDED_STATE_DICT":
        merge_fsdp_weights(written, folder / "merged")  # every rank returns once it is written
        merged = load_file(folder / "merged" / "model.safetensors")
        out["merged_equal"] = all(torch.equal(merged[key], trained[key]) for key in trained)
        args = merge_command_parser().parse_args(
            [str(written), str(folder / "cmd"), "--unsafe_serialization"]
        )
        merge_command(args)
        bin_state = torch.load(folder / "cmd" / "pytorch_model.bin", weights_only=True)
        out["command_equal"] = all(torch.equal(bin_state[key], trained[key]) for key in trained)
    fresh = accelerator.prepare(_model())
    load_fsdp_model(plugin, accelerator, fresh, folder)
    loaded = accelerator.get_state_dict(fresh)
    out["loaded_equal"] = all(torch.equal(loaded[key], trained[key]) for key in trained)
    reset_state(stop_process_group=False)  # the next part reuses the group
    return out


def _reset_and_join(folder: pathlib.Path) -> dict:
    out: dict = {}
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    accelerator.prepare(DataLoader(Numbers(), batch_size=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([model], even_batches=False):
            pass
    out["join_warnings"] = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    accelerator.state.distributed_type = DistributedType.FSDP
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([model]):
            pass
    out["non_ddp_warning"] = [str(w.message) for w in caught]
    accelerator.state.distributed_type = None
    out["type_restored"] = accelerator.distributed_type.value

    AcceleratorState._reset_state()
    out["local_main_after_reset"] = accelerator.is_local_main_process
    out["is_main_after_reset"] = accelerator.is_main_process
    try:  # ranks and sizes are refused after the reset, as in Accelerate
        out["process_index_after_reset"] = accelerator.process_index
    except StateResetError as error:
        out["process_index_after_reset"] = str(error)
    try:
        accelerator.prepare(torch.nn.Linear(1, 1))
        out["prepare_after_reset"] = None
    except AttributeError as error:
        out["prepare_after_reset"] = (isinstance(error, StateResetError), str(error))
    out["fresh_after_reset"] = Accelerator().reduce(torch.ones(1)).item()
    reset_state(stop_process_group=False)  # the next part reuses the group
    return out


def peer_surface_job(folder: str) -> dict:
    """Everything on this rank; returns what each part did."""
    root = pathlib.Path(folder)
    out: dict = {}
    out["sharded"] = _fsdp_files(root / "sharded", "SHARDED_STATE_DICT")
    out["full"] = _fsdp_files(root / "full", "FULL_STATE_DICT")
    out.update(_reset_and_join(root))
    out["rank"] = Accelerator().process_index
    return out
