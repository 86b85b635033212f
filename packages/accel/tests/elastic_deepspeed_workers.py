"""Elastic resume under DeepSpeed ZeRO-1/2/3: saved on 2 processes, resumed on 1, 3 and 4 (spawned).

One spawned job runs the three stages one after the other (accel's state reset in between,
the process group kept). The save job trains epoch 0 of a shuffled map-style dataset on 2
processes, saves mid-epoch and at the epoch boundary (explicit folders), and records the global
sample ids of every step and the gathered full state at each save; a resume job loads each
checkpoint, returns the full state it sees and the sample ids to the end of the epoch (and those
of epoch 1).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from accel import Accelerator
from accel.utils import DeepSpeedPlugin
from accel_state import reset_state

# 24 steps of 2 (2 processes) per epoch; the mid-epoch save after 6 steps leaves 24 samples, and
# 24 and 48 split evenly over 1, 2, 3 and 4 processes of batch 2.
SAMPLES, BATCH, SAVE_AT = 48, 2, 6
STAGES = (1, 2, 3)


class Ids(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample ``i`` is the id ``i``."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> int:
        return index


def full_state(accelerator: Accelerator, model: Any, optimizer: Any) -> dict[str, torch.Tensor]:
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
    result: dict[str, torch.Tensor] = {}
    for name, parameter in module.named_parameters():
        fp32 = safe_get_full_fp32_param(parameter)
        result[f"fp32.{name}"] = fp32.detach().cpu().clone()
        for key in keys:
            value = safe_get_full_optimizer_state(parameter, key)
            result[f"{key}.{name}"] = value.detach().cpu().clone()
    if entries and "step" in entries[0]:
        result["step"] = torch.as_tensor(entries[0]["step"], dtype=torch.float64).cpu().clone()
    for name, tensor in accelerator.get_state_dict(model).items():
        result[f"module.{name}"] = tensor.detach().cpu().clone()
    return result


def setup(
    stage: int, project_dir: str | None = None, optimizer_class: type = torch.optim.AdamW
) -> tuple[Accelerator, Any, Any, Any]:
    """A fresh Accelerator under ZeRO-``stage``; the model, optimizer and loader, prepared.

    With ``project_dir``, checkpoints are named automatically inside it.
    """
    from accel_ckpt import ProjectConfiguration

    reset_state(stop_process_group=False)
    kwargs: dict[str, Any] = {}
    if project_dir is not None:
        kwargs["project_config"] = ProjectConfiguration(
            project_dir=project_dir, automatic_checkpoint_naming=True
        )
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage), **kwargs)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = optimizer_class(model.parameters(), lr=0.01)
    loader = DataLoader(Ids(), batch_size=BATCH, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader


def teardown(accelerator: Accelerator) -> None:
    """Destroy the engine and forget accel's state (the process group stays)."""
    accelerator.free_memory()
    reset_state(stop_process_group=False)


def _global(accelerator: Accelerator, batch: torch.Tensor) -> list[int]:
    """The ids of one step of the whole job, in rank order (= the epoch's global order)."""
    return [int(i) for i in accelerator.gather(batch).tolist()]


def train_step(accelerator: Accelerator, model: Any, optimizer: Any, batch: torch.Tensor) -> float:
    """One optimizer step on ``batch`` (sample ids); returns the mean loss over processes."""
    ids = batch.float().unsqueeze(1)
    features = torch.cat([ids / SAMPLES, ids.sin(), ids.cos(), torch.ones_like(ids)], dim=1)
    loss = (model(features) - ids.cos()).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return float(accelerator.reduce(loss.detach(), reduction="mean"))


def save_job(folder: str) -> dict[int, dict[str, Any]]:
    """2 processes, per stage: epoch 0 with a save after SAVE_AT steps and one at its end, epoch 1;
    then the mid-epoch checkpoint loaded again on 2 processes."""
    results: dict[int, dict[str, Any]] = {}
    for stage in STAGES:
        accelerator, model, optimizer, loader = setup(stage)
        before: list[int] = []
        after: list[int] = []
        mid: dict[str, torch.Tensor] = {}
        for index, batch in enumerate(loader):
            (before if index < SAVE_AT else after).extend(_global(accelerator, batch))
            train_step(accelerator, model, optimizer, batch)
            if index + 1 == SAVE_AT:
                accelerator.save_state(f"{folder}/zero{stage}/mid")
                mid = full_state(accelerator, model, optimizer)
        accelerator.save_state(f"{folder}/zero{stage}/boundary")
        boundary = full_state(accelerator, model, optimizer)
        epoch1: list[int] = []
        for batch in loader:
            epoch1.extend(_global(accelerator, batch))
            train_step(accelerator, model, optimizer, batch)
        teardown(accelerator)
        # The same number of processes loads DeepSpeed's own checkpoint, unconverted.
        accelerator, model, optimizer, loader = setup(stage)
        accelerator.load_state(f"{folder}/zero{stage}/mid")
        same_count = full_state(accelerator, model, optimizer)
        teardown(accelerator)
        results[stage] = {
            "before": before,
            "after": after,
            "epoch1": epoch1,
            "mid": mid,
            "boundary": boundary,
            "same_count": same_count,
        }
    return results


def resume_job(folder: str) -> dict[int, dict[str, Any]]:
    """Any number of processes, per stage: load each checkpoint, report what it restored."""
    results: dict[int, dict[str, Any]] = {}
    for stage in STAGES:
        accelerator, model, optimizer, loader = setup(stage)
        accelerator.load_state(f"{folder}/zero{stage}/mid")
        mid = full_state(accelerator, model, optimizer)
        rest: list[int] = []
        for batch in loader:
            rest.extend(_global(accelerator, batch))
            train_step(accelerator, model, optimizer, batch)
        mid_epoch1 = [i for batch in loader for i in _global(accelerator, batch)]
        teardown(accelerator)

        accelerator, model, optimizer, loader = setup(stage)
        accelerator.load_state(f"{folder}/zero{stage}/boundary")
        boundary = full_state(accelerator, model, optimizer)
        epoch1: list[int] = []
        for batch in loader:
            epoch1.extend(_global(accelerator, batch))
            train_step(accelerator, model, optimizer, batch)
        refusal = ""
        if stage == 3 and accelerator.num_processes == 1:
            refusal = _zero3_sgd_refusal(folder)
        results[stage] = {
            "refusal": refusal,
            "mid": mid,
            "rest": rest,
            "mid_epoch1": mid_epoch1,
            "boundary": boundary,
            "epoch1": epoch1,
        }
        teardown(accelerator)
    return results


def _zero3_sgd_refusal(folder: str) -> str:
    """What loading the 2-process ZeRO-3 checkpoint into a ZeRO-3 engine stepping SGD says."""
    from accel import UnsupportedFeatureError

    accelerator, _, _, _ = setup(3, optimizer_class=torch.optim.SGD)
    try:
        accelerator.load_state(f"{folder}/zero3/mid")
    except UnsupportedFeatureError as error:
        return str(error)
    finally:
        teardown(accelerator)
    return ""
