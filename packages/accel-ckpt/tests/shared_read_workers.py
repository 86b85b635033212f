"""Functions run on spawned processes for the shared-read tests (importable by module name)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from ckpt_helpers import LoaderState, fresh_setup, mlp, same, snapshot, training_setup

from accel_ckpt import (
    AccelCkptError,
    load_checkpoint_in_model,
    load_state,
    read_manifest,
    save_model,
    save_state,
)
from accel_ckpt._coordination import Coordinator
from accel_state import PartialState


class Odd:
    """A custom object whose state holds a timedelta (only the full unpickler rebuilds it)."""

    def __init__(self, state: dict) -> None:
        self.state = state

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


def rchar() -> int:
    """Bytes this process has passed to read()-like system calls (``/proc/self/io``)."""
    with open("/proc/self/io") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["rchar"])


def _failure(function, *args, **kwargs) -> tuple[str, str] | None:
    try:
        function(*args, **kwargs)
    except AccelCkptError as error:
        return type(error).__name__, str(error)
    return None


def _sizes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}


def shared_loads(root: str) -> dict:
    """load_state and load_checkpoint_in_model with shared reads; facts for the test."""
    state = PartialState()
    rank = state.process_index
    base = Path(root)
    out: dict = {"rank": rank}

    setup = training_setup(seed=1)  # the same on every rank, as DDP keeps it
    expected = snapshot(setup)
    path = save_state(
        base / "ckpt", **setup, dataloaders=[LoaderState(5, 1), LoaderState(10 + rank, rank)]
    )
    out["sizes"] = _sizes(path)
    out["models"] = read_manifest(path).contents["models"]

    load_state(path, **fresh_setup(), dataloaders=[LoaderState(), LoaderState()])  # warm-up
    target = fresh_setup()
    loaders = [LoaderState(), LoaderState()]
    before = rchar()
    load_state(path, **target, dataloaders=loaders)
    out["load_state_read"] = rchar() - before
    out["bitwise"] = {
        kind: all(same(g, e) for g, e in zip(snapshot(target)[kind], expected[kind], strict=True))
        for kind in expected
    }
    lm = target["models"][0]
    out["tied"] = lm.head.weight is lm.embed.weight
    out["loaders"] = [(loader.position, loader.seed) for loader in loaders]

    # load_checkpoint_in_model: one file, shards with an index, a pickled file.
    weights = setup["models"][1]
    wide = mlp(width=64, depth=3)
    save_model(weights, base / "single")
    save_model(wide, base / "sharded", max_shard_size="20KB")
    save_model(weights, base / "pickled", safe_serialization=False)
    dist.barrier()
    for name, source in (("single", weights), ("sharded", wide), ("pickled", weights)):
        torch.manual_seed(100 + rank)
        model = mlp(width=64, depth=3) if name == "sharded" else mlp()
        before = rchar()
        keys = load_checkpoint_in_model(model, base / name, strict=True, broadcast_from_rank0=True)
        out[f"{name}_read"] = rchar() - before
        out[f"{name}_same"] = same(model.state_dict(), source.state_dict())
        out[f"{name}_keys"] = (keys.missing_keys, keys.unexpected_keys)
        out[f"{name}_sizes"] = _sizes(base / name)

    # A state only the full unpickler rebuilds (allow_pickle=True on both sides).
    odd = Odd({"names": {"a", "b"}, "when": timedelta(seconds=3), "weights": torch.arange(6.0)})
    odd_path = save_state(base / "odd", custom_objects=[odd], allow_pickle=True)
    received = Odd({})
    load_state(odd_path, custom_objects=[received], allow_pickle=True)
    out["odd"] = received.state["when"] == timedelta(seconds=3) and torch.equal(
        received.state["weights"], torch.arange(6.0)
    )
    out["odd_refused"] = _failure(load_state, odd_path, custom_objects=[Odd({})])

    # Errors on the reading process reach every process.
    missing = base / "no-such-weights" if rank == 0 else base / "single"
    out["missing"] = _failure(load_checkpoint_in_model, mlp(), missing, broadcast_from_rank0=True)
    mismatched = mlp(width=4)
    out["mismatch"] = _failure(
        load_checkpoint_in_model,
        mismatched,
        base / "single",
        strict=True,
        broadcast_from_rank0=True,
    )
    if rank == 0:  # same size, other bytes: only the checksum tells
        damaged = path / out["models"][1]
        data = bytearray(damaged.read_bytes())
        data[-5] ^= 0xFF
        damaged.write_bytes(bytes(data))
    dist.barrier()
    out["corrupt"] = _failure(load_state, path, **fresh_setup())
    out["after"] = Coordinator.current().all_gather(rank)  # the group still works
    return out
