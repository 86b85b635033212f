"""Functions run on 2 spawned processes (importable by module name)."""

from __future__ import annotations

import copy
import gc
import random
import weakref
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from ckpt_helpers import LoaderState, fresh_setup, rng_draws, same, snapshot, train, training_setup
from torch.nn.parallel import DistributedDataParallel

from accel_ckpt import (
    DistributedCheckpointError,
    ProjectConfiguration,
    load_checkpoint_in_model,
    load_state,
    read_manifest,
    save_model,
    save_state,
)
from accel_ckpt._coordination import _checkpoint_group
from accel_ckpt.checksum import crc32_of_file
from accel_state import PartialState, reset_state
from accel_state.group_keeper import free_destroyed_groups


class RankShards:
    """A sharded state: each rank writes and reads back its own file (as FSDP's DCP does)."""

    name = "shards"

    def __init__(self, value: float) -> None:
        self.value = torch.full((4,), value)

    def save(self, folder: Path) -> None:
        rank = dist.get_rank()
        assert folder.is_dir() and folder.parent.name.startswith("."), folder  # still hidden
        torch.save(self.value, folder / f"part_{rank}.pt")

    def load(self, folder: Path) -> None:
        self.value = torch.load(folder / f"part_{dist.get_rank()}.pt")


class DcpShards:
    """A sharded state written through ``torch.distributed.checkpoint``, reporting its files."""

    name = "dcp"

    def __init__(self, value: float) -> None:
        self.value = torch.full((1000,), value)
        self.reported: dict[str, tuple[int, int]] = {}

    def _state(self) -> dict[str, torch.Tensor]:
        return {f"rank{dist.get_rank()}": self.value}

    def save(self, folder: Path) -> dict[str, tuple[int, int]]:
        from torch.distributed.checkpoint import save

        from accel_ckpt.dcp_writer import checksummed_writer

        writer = checksummed_writer(folder)
        save(self._state(), storage_writer=writer)
        self.reported = writer.records
        return self.reported

    def load(self, folder: Path) -> None:
        from torch.distributed.checkpoint import load

        state = {f"rank{dist.get_rank()}": torch.zeros(1000)}
        load(state, checkpoint_id=folder)
        self.value = state[f"rank{dist.get_rank()}"]


class Exploding:
    def state_dict(self):
        raise RuntimeError("state_dict exploded on purpose")

    def load_state_dict(self, state):
        pass


def round_trips(root: str) -> dict:
    """Everything a 2-process job does with checkpoints; returns facts for the test to check."""
    state = PartialState()
    rank = state.process_index
    base = Path(root)
    out: dict = {"rank": rank}

    # DDP-wrapped model trained in lockstep: every rank holds the same weights and moments.
    setup = training_setup(seed=1)
    setup["models"][1] = DistributedDataParallel(setup["models"][1])
    train(setup["models"][1], setup["optimizers"][1], steps=2, seed=rank)  # grads are averaged
    expected = snapshot(setup)
    expected["models"][1] = copy.deepcopy(setup["models"][1].module.state_dict())
    shared_loader = LoaderState(position=5, seed=1)
    own_loader = LoaderState(position=10 + rank, seed=rank)

    random.seed(100 + rank)
    np.random.seed(100 + rank)
    torch.manual_seed(100 + rank)
    path = save_state(base / "ckpt", **setup, dataloaders=[shared_loader, own_loader])
    after = rng_draws()
    out["files"] = sorted(p.name for p in path.iterdir())
    out["contents"] = read_manifest(path).contents

    torch.manual_seed(7)
    target = fresh_setup()
    target["models"][1] = DistributedDataParallel(target["models"][1])
    loaders = [LoaderState(), LoaderState()]
    load_state(path, **target, dataloaders=loaders)
    out["rng_restored"] = rng_draws() == after
    out["loaders"] = [(loader.position, loader.seed) for loader in loaders]
    got = snapshot(target)
    got["models"][1] = target["models"][1].module.state_dict()
    out["bitwise"] = all(
        same(g, e) for kind in expected for g, e in zip(got[kind], expected[kind], strict=True)
    )

    # Asynchronous save from both ranks, then a replacement of the same folder.
    handle = save_state(base / "async", **setup, blocking=False)
    out["async_path"] = str(handle.wait())
    save_state(base / "async", models=setup["models"][:1])
    out["async_files"] = sorted(p.name for p in (base / "async").iterdir())

    # Automatic naming with total_limit on both ranks.
    config = ProjectConfiguration(
        project_dir=str(base / "project"), automatic_checkpoint_naming=True, total_limit=2
    )
    for _ in range(3):
        save_state(models=setup["models"], project_config=config)
    out["kept"] = sorted(p.name for p in (base / "project" / "checkpoints").iterdir())
    fresh = ProjectConfiguration(
        project_dir=str(base / "project"), automatic_checkpoint_naming=True
    )
    out["latest"] = load_state(models=fresh_setup()["models"], project_config=fresh).path.name

    # save_on_each_node on one machine: local rank 0 writes, the folder is shared.
    path = save_state(base / "per_node", models=setup["models"][:1], save_on_each_node=True)
    out["per_node_files"] = sorted(p.name for p in path.iterdir())

    # save_model: only the main process writes; everyone can load after a barrier.
    written = save_model(setup["models"][0], base / "model", max_shard_size="2KB")
    state.wait_for_everyone()
    out["model_files_written"] = len(written)
    model = fresh_setup()["models"][0]
    load_checkpoint_in_model(model, base / "model", device_map={"": "cpu"}, strict=True)
    out["model_loaded"] = same(model.state_dict(), expected["models"][0])

    # A sharded state: every rank writes its part into the checkpoint before it is published.
    shards = RankShards(float(rank))
    path = save_state(base / "sharded", models=setup["models"][:1], sharded_states=[shards])
    out["sharded_contents"] = read_manifest(path).contents["sharded_states"]
    restored = RankShards(-1.0)
    load_state(path, models=fresh_setup()["models"][:1], sharded_states=[restored])
    out["sharded_restored"] = restored.value.tolist()

    # A DCP state reports each file's size and CRC-32, hashed by the rank that wrote it.
    dcp = DcpShards(float(rank) + 0.5)
    path = save_state(base / "dcp", sharded_states=[dcp])
    manifest = read_manifest(path)
    out["dcp_reported"] = dcp.reported
    out["dcp_manifest"] = {
        name: (record.size, record.crc32)
        for name, record in manifest.files.items()
        if name.startswith("dcp/")
    }
    out["dcp_on_disk"] = {
        f"dcp/{file.name}": crc32_of_file(str(file)) for file in sorted((path / "dcp").iterdir())
    }
    out["dcp_contents"] = sorted(manifest.contents["sharded_states"]["dcp"])
    restored_dcp = DcpShards(-1.0)
    load_state(path, sharded_states=[restored_dcp])
    out["dcp_restored"] = torch.equal(restored_dcp.value, dcp.value)

    # A failure on rank 0 only: every rank raises and nothing is committed.
    try:
        save_state(base / "broken", models=setup["models"], custom_objects=[Exploding()])
        out["failure"] = "no error"
    except DistributedCheckpointError as error:
        out["failure"] = f"DistributedCheckpointError: {error}"
    except RuntimeError as error:
        out["failure"] = f"RuntimeError: {error}"
    state.wait_for_everyone()
    out["leftovers"] = sorted(p.name for p in base.iterdir() if "broken" in p.name)

    # Stopping the job and freeing the destroyed groups (what the next group start and the exit
    # do) frees them: nothing here keeps them (or their gloo threads) alive.
    groups = [weakref.ref(dist.group.WORLD), weakref.ref(_checkpoint_group())]
    del setup, target
    reset_state()
    free_destroyed_groups()
    gc.collect()
    out["groups_alive_after_stop"] = [group() is not None for group in groups]
    return out


def per_rank_folders(root: str, folder_of_rank: list[str]) -> dict:
    """Each rank saves to ``root/folder_of_rank[rank]``, then loads only that folder."""
    state = PartialState()
    rank = state.process_index
    folder = Path(root) / folder_of_rank[rank]
    setup = training_setup(seed=3)  # the same states on every rank, as after DDP training
    shared_loader = LoaderState(position=4, seed=9)
    own_loader = LoaderState(position=20 + rank, seed=rank)
    random.seed(200 + rank)
    np.random.seed(200 + rank)
    torch.manual_seed(200 + rank)
    expected = snapshot(setup)
    path = save_state(folder, **setup, dataloaders=[shared_loader, own_loader])
    expected_draws = rng_draws()
    state.wait_for_everyone()
    manifest = read_manifest(path)
    fresh = fresh_setup()
    loaders = [LoaderState(), LoaderState()]
    load_state(folder, **fresh, dataloaders=loaders)  # this folder alone
    return {
        "path": str(path),
        "files": sorted(p.name for p in path.iterdir()),
        "random_states": sorted(manifest.contents["random_states"]),
        "restored": same(snapshot(fresh), expected),
        "loaders": [(loader.position, loader.seed) for loader in loaders],
        "rng_restored": rng_draws() == expected_draws,
    }


class HoldsTensor:
    """A registered object whose state holds one given tensor (a DTensor, a meta tensor...)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def state_dict(self) -> dict:
        return {"moments": {"exp_avg": self.tensor}}

    def load_state_dict(self, state: dict) -> None:
        self.tensor = state["moments"]["exp_avg"]


def _refusal(function, *args, **kwargs) -> str:
    try:
        function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the type and message are what the test checks
        return f"{type(error).__name__}: {error}"
    return "nothing raised"


def refuses_unwritable_tensors(root: str) -> dict:
    """A DTensor or a meta tensor in a save: every rank raises, the previous checkpoint stays."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from accel_ckpt import latest_checkpoint
    from accel_ckpt.pickle_io import save_pickled
    from accel_ckpt.safetensors_io import write_safetensors

    PartialState()
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    dtensor = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    meta = torch.empty(8, device="meta")
    out: dict = {}
    for kind, tensor in (("dtensor", dtensor), ("meta", meta)):
        path = Path(root, f"direct-{kind}-{rank}")
        out[f"safetensors_{kind}"] = _refusal(
            write_safetensors, path.with_suffix(".safetensors"), {"layer.weight": tensor}
        )
        out[f"pickle_{kind}"] = _refusal(
            save_pickled, {"state": {0: {"exp_avg": tensor}}}, path.with_suffix(".pt")
        )
        out[f"{kind}_files_left"] = sorted(p.name for p in Path(root).glob(f"direct-{kind}-*"))

    config = ProjectConfiguration(project_dir=f"{root}/project", automatic_checkpoint_naming=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)  # the same on both ranks
    save_state(models=[model], project_config=config)  # checkpoint_0: the good one
    for kind, tensor in (("dtensor", dtensor), ("meta", meta)):
        holder = HoldsTensor(tensor if rank == 0 else torch.zeros(4))  # only rank 0 holds it
        out[f"save_state_{kind}"] = _refusal(
            save_state, models=[model], custom_objects=[holder], project_config=config
        )
    meta_model = torch.nn.Linear(4, 2, device="meta" if rank == 0 else "cpu")
    out["save_state_meta_model"] = _refusal(save_state, models=[meta_model], project_config=config)
    dist.barrier()
    checkpoints = Path(root, "project", "checkpoints")
    out["checkpoints"] = sorted(p.name for p in checkpoints.iterdir())
    out["latest"] = latest_checkpoint(checkpoints).name
    fresh_model = torch.nn.Linear(4, 2)
    load_state(checkpoints / "checkpoint_0", models=[fresh_model])
    out["latest_loads"] = same(fresh_model.state_dict(), model.state_dict())
    return out


def loads_full_checkpoints_into_shards(root: str) -> dict:
    """load_checkpoint_in_model(full_state_dict=, broadcast_from_rank0=) on 2 processes."""
    from safetensors.torch import save_file
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from accel_ckpt import load_checkpoint_in_model

    state = PartialState()
    rank = state.process_index
    torch.manual_seed(0)
    source = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    expected = {k: v.clone() for k, v in source.state_dict().items()}
    only_rank0 = Path(root) / "only_rank0"
    if rank == 0:
        only_rank0.mkdir()
        save_file(expected, str(only_rank0 / "model.safetensors"))
    state.wait_for_everyone()
    # Process 1 names a folder that does not exist there: only process 0 reads.
    folder = only_rank0 if rank == 0 else Path(root) / "absent_on_this_rank"

    torch.manual_seed(1 + rank)  # each rank starts from different weights
    plain = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    keys = load_checkpoint_in_model(plain, folder, broadcast_from_rank0=True, strict=True)
    plain_ok = all(torch.equal(plain.state_dict()[k], v) for k, v in expected.items())

    sharded = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    for layer in sharded:
        fully_shard(layer)
    fully_shard(sharded)
    load_checkpoint_in_model(sharded, only_rank0, full_state_dict=True)
    is_dtensor = all(isinstance(p, DTensor) for p in sharded.parameters())
    gathered = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
    sharded_ok = all(torch.equal(gathered[k], v) for k, v in expected.items())
    return {
        "plain_ok": plain_ok,
        "missing": keys.missing_keys,
        "unexpected": keys.unexpected_keys,
        "is_dtensor": is_dtensor,
        "sharded_ok": sharded_ok,
    }
