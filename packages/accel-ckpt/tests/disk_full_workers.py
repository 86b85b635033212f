"""Saving into a file system that cannot hold the checkpoint (run in spawned processes)."""

from __future__ import annotations

import resource
from pathlib import Path

import torch

from accel_ckpt import (
    AccelCkptError,
    CheckpointDiskFullError,
    ProjectConfiguration,
    load_state,
    save_state,
)
from accel_ckpt.project import latest_checkpoint


def _model(width: int) -> torch.nn.Module:
    torch.manual_seed(width)
    return torch.nn.Linear(width, width)


def save_small_then_too_big(project: str, width: int, file_size_limit: int = 0) -> dict:
    """Save a small checkpoint, then one too big for the disk (or the file-size limit).

    Returns, per process: the error of the second save, what the project folder holds after
    it, and whether the first checkpoint still loads as the newest one.
    """
    config = ProjectConfiguration(project, automatic_checkpoint_naming=True)
    small = _model(4)
    save_state(models=[small], project_config=config)
    if file_size_limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, resource.RLIM_INFINITY))
    error: AccelCkptError | None = None
    try:
        save_state(models=[_model(width)], project_config=config)
    except AccelCkptError as raised:
        error = raised
    if file_size_limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    folder = Path(project) / "checkpoints"
    latest = latest_checkpoint(folder)
    fresh = torch.nn.Linear(4, 4)
    load_state(
        models=[fresh],
        project_config=ProjectConfiguration(project, automatic_checkpoint_naming=True),
    )
    return {
        "type": type(error).__name__ if error else None,
        "disk_full": isinstance(error, CheckpointDiskFullError),
        "message": str(error),
        "left": sorted(path.name for path in folder.iterdir()),
        "latest": latest.name if latest else None,
        "loaded_small": all(
            torch.equal(a, b)
            for a, b in zip(fresh.state_dict().values(), small.state_dict().values(), strict=True)
        ),
    }
