"""One 2-process job checking issue 28's names where they are distributed (see test_names_distributed).

Each check returns plain values the test asserts on; the job runs them in order on every rank.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from accel import Accelerator, DataLoaderConfiguration
from accel_state import GradientState, reset_state


def restarts(cycles: int) -> list[float]:
    """``reset_state()`` and a new Accelerator, ``cycles`` times, each with a prepared DDP model.

    The models of earlier cycles stay alive (as in a test module that keeps them), which made the
    third start hang in the rendezvous before the fix.
    """
    kept: list[Any] = []
    sums = []
    for _ in range(cycles):
        reset_state()
        accelerator = Accelerator(cpu=True)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        accelerator.backward(model(torch.ones(2, 4)).sum())
        optimizer.step()
        kept.append(model)
        sums.append(accelerator.reduce(torch.tensor([1.0]), "sum").item())
    return sums


def print_after_end_training() -> dict[str, Any]:
    """``accelerator.print`` and the rank facts still work after ``end_training()``."""
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    accelerator.end_training()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        accelerator.print("after the end", rank)
    return {
        "printed": out.getvalue(),
        "is_main_process": accelerator.is_main_process,
        "process_index": accelerator.process_index,
        "num_processes": accelerator.num_processes,
    }


def dispatched_slices() -> dict[str, Any]:
    """``prepare_data_loader(slice_fn_for_dispatch=)`` with ``dispatch_batches`` on 2 ranks."""
    reset_state()
    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True)
    )
    seen: list[dict[str, Any]] = []

    def negated(batch: torch.Tensor, tensor_slice: slice, **kwargs: Any) -> torch.Tensor:
        seen.append(kwargs)
        return -batch[tensor_slice]

    default = accelerator.prepare_data_loader(DataLoader(torch.arange(16.0), batch_size=4))
    default_batches = [batch.tolist() for batch in default]
    references = GradientState().dataloader_references
    custom = accelerator.prepare_data_loader(
        DataLoader(torch.arange(16.0), batch_size=4), slice_fn_for_dispatch=negated
    )
    custom_batches = []
    active_during = []
    for batch in custom:
        custom_batches.append(batch.tolist())
        active_during.append(GradientState().dataloader_references[-1] is custom)
    return {
        "default": default_batches,
        "custom": custom_batches,
        "slice_kwargs": seen[0] if seen else None,
        "references_after": references,
        "active_during": active_during,
    }


def full_checkpoint_broadcast_into_shards(folder: str) -> dict[str, Any]:
    """``load_checkpoint_in_model(full_state_dict=True, broadcast_from_rank0=True)`` into FSDP2.

    Only rank 0 has the file; every rank ends with its shard of the saved weights.
    """
    from safetensors.torch import save_file
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from accel.utils import load_checkpoint_in_model

    reset_state()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    source = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    expected = {k: v.clone() for k, v in source.state_dict().items()}
    rank_zero_only = Path(folder, "rank_zero_only")
    if accelerator.is_main_process:
        rank_zero_only.mkdir(parents=True)
        save_file(expected, str(rank_zero_only / "model.safetensors"))
    accelerator.wait_for_everyone()
    checkpoint = rank_zero_only if accelerator.is_main_process else Path(folder, "absent")
    torch.manual_seed(1 + accelerator.process_index)
    sharded = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    for layer in sharded:
        fully_shard(layer)
    fully_shard(sharded)
    keys = load_checkpoint_in_model(
        sharded, checkpoint, full_state_dict=True, broadcast_from_rank0=True, strict=True
    )
    local_shapes = {k: tuple(v.to_local().shape) for k, v in sharded.state_dict().items()}
    gathered = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
    return {
        "all_dtensor": all(isinstance(p, DTensor) for p in sharded.parameters()),
        "restored": all(torch.equal(gathered[k], v) for k, v in expected.items()),
        "local_weight_rows": local_shapes["0.weight"][0],
        "missing": list(keys.missing_keys),
        "unexpected": list(keys.unexpected_keys),
    }


def cpu_information_and_affinity() -> dict[str, Any]:
    """``get_cpu_distributed_information`` and ``set_numa_affinity`` in a 2-process job."""
    from accel.utils import get_cpu_distributed_information, set_numa_affinity

    info = get_cpu_distributed_information()
    before = sorted(os.sched_getaffinity(0))
    set_numa_affinity(info.local_rank)
    after = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, before)  # the rest of the job runs as before
    return {
        "info": (info.rank, info.world_size, info.local_rank, info.local_world_size),
        "before": before,
        "after": after,
    }


def trackers_and_rng(folder: str) -> dict[str, Any]:
    """``GeneralTracker.start`` per process, and ``RNGType``'s new members refused on every rank."""
    from accel.tracking import GeneralTracker
    from accel.utils import synchronize_rng_states

    class Recording(GeneralTracker):
        name = "recording"
        requires_logging_directory = False

        def __init__(self, main_process_only: bool) -> None:
            self.main_process_only = main_process_only
            self.events: list[str] = []

        def start(self) -> None:
            self.events.append("start")

        def store_init_configuration(self, values: Any) -> None:
            self.events.append(f"config {dict(values)}")

        def log(self, values: Any, step: int | None = None, **kwargs: Any) -> None:
            self.events.append(f"log {dict(values)}")

    reset_state()
    main_only, everywhere = Recording(True), Recording(False)
    accelerator = Accelerator(cpu=True, log_with=[main_only, everywhere], project_dir=folder)
    accelerator.init_trackers("names", config={"lr": 0.1})
    accelerator.log({"loss": 1.0})
    try:
        synchronize_rng_states(["hpu"])
        refusal = ""
    except Exception as error:  # noqa: BLE001 - the message is what the test reads
        refusal = f"{type(error).__name__}: {error}"
    accelerator.wait_for_everyone()  # both ranks got past the refusal: nobody hangs in it
    return {"main_only": main_only.events, "everywhere": everywhere.events, "hpu": refusal}


def names_job(folder: str) -> dict[str, Any]:
    """Every check above, on each rank (``folder`` is shared)."""
    out: dict[str, Any] = {"restarts": restarts(3)}
    out["slices"] = dispatched_slices()
    out["full_broadcast"] = full_checkpoint_broadcast_into_shards(folder)
    out["cpu"] = cpu_information_and_affinity()
    out["trackers_rng"] = trackers_and_rng(folder)
    out["print_after_end"] = print_after_end_training()  # last: it ends the job's state
    return out
