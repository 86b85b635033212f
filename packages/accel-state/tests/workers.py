"""Functions run inside spawned worker processes (importable by module name)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from accel_state import GradientState, PartialState


def describe_state() -> dict:
    state = PartialState()
    total = torch.tensor([state.process_index + 1.0])
    dist.all_reduce(total)
    return {
        "type": state.distributed_type.value,
        "num_processes": state.num_processes,
        "index": state.process_index,
        "local_index": state.local_process_index,
        "main": state.is_main_process,
        "local_main": state.is_local_main_process,
        "last": state.is_last_process,
        "backend": state.backend,
        "use_distributed": state.use_distributed,
        "sum": total.item(),
        "group_started_by_us": PartialState._shared_state["owns_process_group"],
    }


def ordering(log_dir: str) -> list[str]:
    """Record, per rank, what rank 0 had finished when this rank entered the block."""
    state = PartialState()
    log = Path(log_dir)
    with state.main_process_first():
        seen = sorted(path.name for path in log.iterdir())
        if state.is_main_process:
            time.sleep(0.5)
            (log / "main-done").write_text("x")
    with state.local_main_process_first():
        local_seen = sorted(path.name for path in log.iterdir())
        if state.is_local_main_process:
            time.sleep(0.3)
            (log / f"local-main-done-{state.process_index}").write_text("x")
    return [",".join(seen), ",".join(local_seen)]


def barrier_timing() -> float:
    """Rank 0 sleeps before the barrier; every rank returns when it got past it."""
    state = PartialState()
    if state.is_main_process:
        time.sleep(1.0)
    state.wait_for_everyone()
    return time.time()


def split_everything(apply_padding: bool) -> dict:
    state = PartialState()
    out = {}
    with state.split_between_processes(list(range(7)), apply_padding=apply_padding) as share:
        out["list"] = share
    with state.split_between_processes(
        ("a", "b", "c", "d", "e"), apply_padding=apply_padding
    ) as share:
        out["tuple"] = share
    with state.split_between_processes(
        torch.arange(10).reshape(5, 2), apply_padding=apply_padding
    ) as share:
        out["tensor"] = share.tolist()
    inputs = {"x": [1, 2, 3, 4], "y": torch.tensor([10, 20, 30, 40])}
    with state.split_between_processes(inputs, apply_padding=apply_padding) as share:
        out["dict"] = {"x": share["x"], "y": share["y"].tolist()}
    with state.split_between_processes([0], apply_padding=apply_padding) as share:
        out["tiny"] = share
    with state.split_between_processes("abcde", apply_padding=apply_padding) as share:
        out["string"] = share
    return out


def decorated_calls() -> dict:
    state = PartialState()
    return {
        "main": state.on_main_process(lambda: state.process_index)(),
        "local_main": state.on_local_main_process(lambda: state.process_index)(),
        "last": state.on_last_process(lambda: state.process_index)(),
        "one": state.on_process(process_index=1)(lambda: state.process_index)(),
        "local_one": state.on_local_process(local_process_index=1)(lambda: state.process_index)(),
    }


def printing(path: str) -> None:
    import contextlib

    state = PartialState()
    with open(f"{path}.{state.process_index}", "w") as handle, contextlib.redirect_stdout(handle):
        state.print("hello", state.process_index)


def gradient_state_is_per_process() -> bool:
    state = PartialState()
    gradient_state = GradientState()
    gradient_state.set_sync_gradients(state.process_index == 0)
    state.wait_for_everyone()
    return GradientState().sync_gradients


def adopt_existing_group() -> dict:
    """A library that started its own process group, then uses PartialState."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        del os.environ[name]
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    state = PartialState()
    result = {
        "index": state.process_index,
        "num": state.num_processes,
        "owns": PartialState._shared_state["owns_process_group"],
    }
    state.wait_for_everyone()
    dist.destroy_process_group()
    return result


def fail_on_rank_one() -> None:
    state = PartialState()
    if state.process_index == 1:
        raise RuntimeError("rank one exploded on purpose")
    state.wait_for_everyone()


def hang_forever() -> None:
    time.sleep(600)


def barrier_with_a_straggler() -> None:
    state = PartialState()
    if state.process_index == 1:
        time.sleep(300)
    state.wait_for_everyone()


def group_freed_after_stop() -> bool:
    """Start the group, use DDP (which imports torch._dynamo), stop: is the group object gone?"""
    import gc
    import weakref

    from torch.nn.parallel import DistributedDataParallel

    from accel_state import reset_state
    from accel_state.group_keeper import free_destroyed_groups

    PartialState()
    model = DistributedDataParallel(torch.nn.Linear(3, 2))
    model(torch.ones(4, 3)).sum().backward()
    group = weakref.ref(dist.group.WORLD)
    del model
    reset_state()
    free_destroyed_groups()  # what the next group start and the exit do
    gc.collect()
    return group() is None


def cause_reported_after_a_peer_breaks() -> None:
    """Rank 1 closes its connections, waits, then raises: rank 0's transport error comes first."""
    import torch.distributed as dist

    from accel_state.group_keeper import free_destroyed_groups

    state = PartialState()
    if state.process_index == 1:
        dist.destroy_process_group()
        free_destroyed_groups()  # close its connections now, not at the next start or exit
        time.sleep(2)
        raise RuntimeError("the real cause, on rank 1")
    state.wait_for_everyone()


def device_and_cpu_flag() -> tuple[str, str | None]:
    """This worker's device type and the ACCEL_USE_CPU it started with."""
    import os

    return PartialState().device.type, os.environ.get("ACCEL_USE_CPU")


def mesh_layouts() -> dict:
    """Build the meshes of three layouts; compare the arithmetic ranks with the built meshes."""
    import torch.distributed as dist

    from accel_state import ParallelismConfig, PartialState
    from accel_state.device_mesh import ParallelMesh, activate

    state = PartialState()
    out: dict = {}
    for name, sizes in {
        "dp_shard2_tp2": {"dp_shard_size": 2, "tp_size": 2},
        "hsdp2x2": {"dp_replicate_size": 2, "dp_shard_size": 2},
        "tp_auto": {"tp_size": -1},
    }.items():
        mesh = ParallelMesh(ParallelismConfig(**sizes), "cpu")
        world = mesh.build()
        agree = {
            dim: mesh.get_mesh(dim).get_local_rank() == mesh.local_rank(dim)
            for dim in [*mesh.names, "dp", "dp_shard_cp", "dp_cp"]
            if mesh.get_optional_mesh(dim) is not None
        }
        activate(mesh)
        record = {
            "names": list(world.mesh_dim_names),
            "agree": agree,
            "dp": (state.data_parallel_size, state.data_parallel_process_index),
            "tp_size": mesh.config.tp_size,
        }
        if state.data_parallel_size > 1:
            total = torch.tensor([float(state.process_index)])
            dist.all_reduce(total, group=state.data_parallel_group)
            record["dp_sum"] = float(total)
        try:
            mesh.get_mesh("cp")
        except Exception as error:  # noqa: BLE001 - the test reads the message
            record["cp_error"] = str(error)
        out[name] = record
    activate(None)
    out["plain_dp"] = (state.data_parallel_size, state.data_parallel_process_index)
    return out


def accelerate_members() -> dict[str, object]:
    state = PartialState()
    state.set_device()
    return {
        "repr_type": f"{state.distributed_type}",
        "value": state.distributed_type.value,
        "default_device": str(state.default_device),
    }


def restart_while_old_groups_live(cycles: int) -> list[float]:
    """Reset and start the group ``cycles`` times, keeping each old group alive (as DDP does).

    Each cycle sums the ranks over a DDP model's group; the models of earlier cycles still hold
    theirs, so a new group that rendezvoused on the old store would read stale keys and hang.
    """
    from torch.nn.parallel import DistributedDataParallel

    from accel_state import reset_state

    held: list[DistributedDataParallel] = []
    sums = []
    for _ in range(cycles):
        reset_state()
        state = PartialState()
        held.append(DistributedDataParallel(torch.nn.Linear(2, 2)))
        total = torch.tensor([state.process_index + 1.0])
        dist.all_reduce(total)
        sums.append(total.item())
    return sums
