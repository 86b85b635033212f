"""Elastic-resume matrix: jobs that save on 2 processes and resume on M, every strategy in turn.

One spawned save job runs every strategy of :data:`REGISTRY` one after another (accel's state is
reset in between, the process group stays); each resume job does the same on M processes. A
strategy is a :class:`Row`: how to build the Accelerator for a process count and how to read the
gathered full model + optimizer state (DeepSpeed rows only where deepspeed is installed).

Sizes: :data:`SAMPLES` = 48 samples, :data:`BATCH` = 2 per data-parallel rank; the mid-epoch
checkpoint is taken after :data:`MID` = 24 samples, so the 24 left and the 48 of the next epoch
split evenly over 1, 2, 3 and 4 data-parallel ranks (no padding, no duplicates).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import pathlib
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from accel import Accelerator
from accel_data import ResumeStateError
from accel_state import reset_state

SAMPLES, BATCH, MID, SAVED_ON = 48, 2, 24, 2
RESUME_SIZES = (1, 3, 4)


class Ids(torch.utils.data.Dataset):
    """Sample ``i`` is the id ``i``."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> int:
        return index


class Stream(IterableDataset):
    """An iterable dataset (sharded by rank when prepared)."""

    def __iter__(self):
        return iter(range(SAMPLES))


class TwoLayers(torch.nn.Module):
    """Two Linear layers with a tensor-parallel plan (column-wise, then row-wise)."""

    tp_plan: ClassVar[dict[str, str]] = {"fc1": "colwise", "fc2": "rowwise"}

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 6)
        self.fc2 = torch.nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


# ---------------------------------------------------------------------- the strategy registry
@dataclasses.dataclass(frozen=True)
class Row:
    """One strategy of the matrix.

    Attributes:
        build: Process count -> ``Accelerator`` keyword arguments.
        full_state: ``(accelerator, model, optimizer)`` -> the gathered full model and optimizer
            state, flat (``model.<fqn>``, ``optimizer.<...>``), identical on every process.
    """

    build: Callable[[int], dict[str, Any]]
    full_state: Callable[[Accelerator, Any, Any], dict[str, Any]]


def torch_full_state(accelerator: Accelerator, model: Any, optimizer: Any) -> dict[str, Any]:
    """Full model + optimizer state by FQN through ``torch.distributed.checkpoint.state_dict``."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    strategy = accelerator.strategy
    if hasattr(strategy, "settle"):
        strategy.settle(model)
    # cpu_offload only off the CPU: FSDP1 crashes offloading CPU tensors (see fsdp_checkpoint).
    offload = any(p.device.type != "cpu" for p in model.parameters())
    options = StateDictOptions(full_state_dict=True, cpu_offload=offload)
    raw = getattr(optimizer, "optimizer", optimizer)
    flat: dict[str, Any] = {}
    _flatten("model", get_model_state_dict(model, options=options), flat)
    _flatten("optimizer", get_optimizer_state_dict(model, raw, options=options), flat)
    return {key: _plain(value) for key, value in flat.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        full = getattr(value, "full_tensor", None)
        return (full() if full is not None else value).detach().cpu().clone()
    return value


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}", item, out)
    elif isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list)) for v in value):
        for index, item in enumerate(value):
            _flatten(f"{prefix}.{index}", item, out)
    else:
        out[prefix] = value


def _fsdp(version: int) -> Callable[[int], dict[str, Any]]:
    def build(world_size: int) -> dict[str, Any]:
        from accel import FullyShardedDataParallelPlugin

        return {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=version)}

    return build


#: Mesh layouts (dp_shard, tp) by process count. Saved on 2 as 1 x 2 (tensor parallel only), it
#: resumes with both sizes changing: 1 x 1 (one process, no mesh), 3 x 1 (FSDP2 over 3, uneven
#: shards of the 6-wide layer) and 2 x 2 (FSDP2 and tensor parallel together).
MESH_LAYOUTS = {1: (1, 1), 2: (1, 2), 3: (3, 1), 4: (2, 2)}


def _mesh(world_size: int) -> dict[str, Any]:
    from accel import ParallelismConfig

    dp_shard, tp = MESH_LAYOUTS[world_size]
    return {"parallelism_config": ParallelismConfig(dp_shard_size=dp_shard, tp_size=tp)}


def deepspeed_full_state(accelerator: Accelerator, model: Any, optimizer: Any) -> dict[str, Any]:
    """The whole training state of a DeepSpeed engine, gathered, on the CPU of every rank.

    Keys: ``fp32.<name>`` (fp32 master parameter), ``<state>.<name>`` for each tensor state of the
    optimizer (``exp_avg``, ``exp_avg_sq`` for Adam), ``step`` (the optimizer's step count) and
    ``module.<name>`` (the module's weights). Collective: call on every rank.
    """
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    module = accelerator.unwrap_model(model)
    zero = optimizer.optimizer  # accel's wrapper -> ZeRO optimizer -> torch optimizer
    base = zero.optimizer
    # ZeRO-1/2 link each parameter to its optimizer-state fragments lazily, at the first step:
    # right after a load (DeepSpeed's own format) they are not linked yet.
    link = getattr(zero, "_lazy_init_hp_params_optimizer_state", None)
    if callable(link) and base.state:
        link()
    entries = [state for state in base.state.values() if state]
    keys = sorted(
        {
            key
            for state in entries
            for key, value in state.items()
            if key != "step" and isinstance(value, torch.Tensor)
        }
    )
    result: dict[str, Any] = {}
    for name, parameter in module.named_parameters():
        result[f"fp32.{name}"] = safe_get_full_fp32_param(parameter).detach().cpu().clone()
        for key in keys:
            value = safe_get_full_optimizer_state(parameter, key)
            result[f"{key}.{name}"] = value.detach().cpu().clone()
    if entries and "step" in entries[0]:
        result["step"] = torch.as_tensor(entries[0]["step"], dtype=torch.float64).cpu().clone()
    for name, tensor in accelerator.get_state_dict(model).items():
        result[f"module.{name}"] = tensor.detach().cpu().clone()
    return result


def _zero(stage: int) -> Callable[[int], dict[str, Any]]:
    def build(world_size: int) -> dict[str, Any]:
        from accel.utils import DeepSpeedPlugin

        return {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=stage)}

    return build


REGISTRY: dict[str, Row] = {
    "ddp": Row(lambda world_size: {}, torch_full_state),
    "fsdp1": Row(_fsdp(1), torch_full_state),
    "fsdp2": Row(_fsdp(2), torch_full_state),
    "mesh_dp_shard_x_tp": Row(_mesh, torch_full_state),
}
#: DeepSpeed rows (present where deepspeed is installed): on another process count the ZeRO
#: checkpoint is converted to DeepSpeed's universal format at load.
ZERO_ROWS = {f"zero{stage}": Row(_zero(stage), deepspeed_full_state) for stage in (1, 2, 3)}
if importlib.util.find_spec("deepspeed") is not None:
    REGISTRY.update(ZERO_ROWS)


# ---------------------------------------------------------------------- one strategy's run
def setup(
    name: str,
    world_size: int,
    optimizer_class: type = torch.optim.AdamW,
    project_dir: str | None = None,
) -> tuple[Accelerator, Any, Any, Any]:
    """A fresh Accelerator for strategy ``name``; the model, optimizer and loader, prepared.

    With ``project_dir``, checkpoints are named automatically inside it.
    """
    from accel_ckpt import ProjectConfiguration

    reset_state(stop_process_group=False)
    kwargs = REGISTRY[name].build(world_size)
    if project_dir is not None:
        kwargs["project_config"] = ProjectConfiguration(
            project_dir=project_dir, automatic_checkpoint_naming=True
        )
    accelerator = Accelerator(**kwargs)
    torch.manual_seed(0)
    model = TwoLayers()
    optimizer = optimizer_class(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    loader = DataLoader(Ids(), batch_size=BATCH, shuffle=True)
    model, optimizer, _, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    torch.manual_seed(1000 + accelerator.process_index)  # a stream per process (dropout...)
    return accelerator, model, optimizer, loader


def teardown(accelerator: Accelerator) -> None:
    """Free the engines (DeepSpeed's) and forget accel's state; the process group stays."""
    accelerator.free_memory()
    reset_state(stop_process_group=False)


def _inputs(batch: torch.Tensor) -> torch.Tensor:
    ids = batch.float().unsqueeze(1)
    return torch.sin(ids * torch.arange(1.0, 5.0) / 7.0)


def train_step(
    accelerator: Accelerator, model: Any, optimizer: Any, batch: torch.Tensor
) -> torch.Tensor:
    """One optimizer step on ``batch`` (sample ids); returns this process's loss, detached."""
    loss = model(_inputs(batch)).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


def _global(accelerator: Accelerator, batch: torch.Tensor) -> list[int]:
    """One step's ids of the whole job in data-parallel rank order (= the epoch's order).

    Ranks of one data-parallel group (tensor-parallel peers) read the same batch: it is kept
    once, after checking they agree.
    """
    ids = batch.tolist()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return ids
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (accelerator.state.partial.data_parallel_process_index, ids))
    by_rank: dict[int, list[int]] = {}
    for dp_rank, rank_ids in everyone:
        if by_rank.setdefault(dp_rank, rank_ids) != rank_ids:
            raise AssertionError(f"data-parallel rank {dp_rank}'s peers read different batches")
    return [i for dp_rank in sorted(by_rank) for i in by_rank[dp_rank]]


def _train_epoch(accelerator: Accelerator, model: Any, optimizer: Any, loader: Any) -> list[int]:
    """Train on the rest of this epoch; the sample ids of the whole job, in the global order."""
    ids = []
    for batch in loader:
        ids.extend(_global(accelerator, batch))
        train_step(accelerator, model, optimizer, batch)
    return ids


def _write_full(accelerator: Accelerator, name: str, model: Any, optimizer: Any, path: str) -> None:
    state = REGISTRY[name].full_state(accelerator, model, optimizer)
    if accelerator.is_main_process:
        torch.save(state, path)
    accelerator.wait_for_everyone()


def _folders(root: str, name: str) -> dict[str, str]:
    base = pathlib.Path(root) / name
    return {
        "mid": str(base / "mid"),
        "boundary": str(base / "boundary"),
        "mid_full": str(base / "mid_full.pt"),
        "boundary_full": str(base / "boundary_full.pt"),
    }


def save_job(root: str, names: list[str]) -> dict[str, Any]:
    """2 processes, each strategy: epoch 0 saving at MID samples and at its end; then epoch 1."""
    report: dict[str, Any] = {}
    for name in names:
        folders = _folders(root, name)
        accelerator, model, optimizer, loader = setup(name, SAVED_ON)
        before: list[int] = []
        after: list[int] = []
        probe = None
        for batch in loader:
            ids = _global(accelerator, batch)
            (before if len(before) < MID else after).extend(ids)
            train_step(accelerator, model, optimizer, batch)
            if len(before) == MID and not after and probe is None:
                accelerator.save_state(folders["mid"])
                probe = torch.rand(3)  # the RNG stream right after the save
                _write_full(accelerator, name, model, optimizer, folders["mid_full"])
        accelerator.save_state(folders["boundary"])
        _write_full(accelerator, name, model, optimizer, folders["boundary_full"])
        epoch1 = _train_epoch(accelerator, model, optimizer, loader)
        teardown(accelerator)
        # The same process count loads the checkpoint as it was written (no resharding or
        # conversion) and must see the same state.
        accelerator, model, optimizer, _ = setup(name, SAVED_ON)
        accelerator.load_state(folders["mid"])
        full = REGISTRY[name].full_state(accelerator, model, optimizer)
        same_count = compare(torch.load(folders["mid_full"], weights_only=False), full)
        teardown(accelerator)
        report[name] = {
            "before": before,
            "after": after,
            "epoch1": epoch1,
            "probe": probe,
            "same_count": same_count,
        }
    return report


def compare(saved: dict[str, Any], loaded: dict[str, Any]) -> list[str]:
    """What differs between two flat full states (keys, then bit-equality of each tensor)."""
    problems = []
    if saved.keys() != loaded.keys():
        problems.append(
            f"keys differ: only saved {sorted(saved.keys() - loaded.keys())[:5]}, "
            f"only loaded {sorted(loaded.keys() - saved.keys())[:5]}"
        )
    for key in sorted(saved.keys() & loaded.keys()):
        old, new = saved[key], loaded[key]
        if isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor):
            same = (
                isinstance(old, torch.Tensor)
                and isinstance(new, torch.Tensor)
                and old.dtype == new.dtype
                and torch.equal(old, new)
            )
        else:
            same = old == new or (
                isinstance(old, float)
                and isinstance(new, float)
                and math.isnan(old)
                and math.isnan(new)
            )
        if not same:
            problems.append(f"{key}: saved {old!r} != loaded {new!r}")
    return problems


def resume_job(root: str, names: list[str]) -> dict[str, Any]:
    """M processes, each strategy: load mid, check, finish epoch 0; load boundary, check, epoch 1."""
    report: dict[str, Any] = {}
    for name in names:
        folders = _folders(root, name)
        accelerator, model, optimizer, loader = setup(name, dist_world_size())
        accelerator.load_state(folders["mid"])
        probe = torch.rand(3)
        full = REGISTRY[name].full_state(accelerator, model, optimizer)
        mid_problems = compare(torch.load(folders["mid_full"], weights_only=False), full)
        rest = _train_epoch(accelerator, model, optimizer, loader)
        accelerator.load_state(folders["boundary"])
        full = REGISTRY[name].full_state(accelerator, model, optimizer)
        boundary_problems = compare(torch.load(folders["boundary_full"], weights_only=False), full)
        epoch1 = _train_epoch(accelerator, model, optimizer, loader)
        report[name] = {
            "mid": mid_problems,
            "boundary": boundary_problems,
            "rest": rest,
            "epoch1": epoch1,
            "probe": probe,
        }
        if name == "ddp":
            accelerator.load_state(folders["mid"])
            report[name]["probe_again"] = torch.rand(3)
            report[name]["refusal"] = _refusal(accelerator)
        teardown(accelerator)
        if name == "zero3" and dist_world_size() == 1:
            report[name]["refusal"] = _zero3_sgd_refusal(folders["mid"])
    return report


def dist_world_size() -> int:
    """This job's process count (1 without a process group)."""
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def _refusal(accelerator: Accelerator) -> str:
    """What loading a 5-process mid-epoch state into an iterable-dataset loader says."""
    stream = accelerator.prepare(DataLoader(Stream(), batch_size=BATCH))
    state = stream.state_dict()
    state.update(num_processes=5, batches_yielded=2, samples_consumed=None)
    try:
        stream.load_state_dict(state)
    except ResumeStateError as error:
        return str(error)
    return ""


def _zero3_sgd_refusal(folder: str) -> str:
    """What loading the 2-process ZeRO-3 checkpoint into a ZeRO-3 engine stepping SGD says.

    DeepSpeed's universal load under ZeRO-3 restores Adam's states only.
    """
    from accel import UnsupportedFeatureError

    accelerator, _, _, _ = setup("zero3", dist_world_size(), optimizer_class=torch.optim.SGD)
    try:
        accelerator.load_state(folder)
    except UnsupportedFeatureError as error:
        return str(error)
    finally:
        teardown(accelerator)
    return ""
