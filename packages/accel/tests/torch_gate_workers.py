"""Worker functions of test_torch_gates.py: ask for a gated feature, report what happened."""

from __future__ import annotations

from collections.abc import Callable

import torch

from accel import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig
from accel_state.errors import TorchFeatureError


def _attempt(make: Callable[[], object]) -> tuple[str, str]:
    """``("ok", "")`` when ``make()`` works, else the torch-version error's class and message.

    Any other error fails the worker with its traceback.
    """
    try:
        make()
    except TorchFeatureError as error:  # accel's TorchVersionError or accel-state's own
        return type(error).__name__, str(error)
    return "ok", ""


def fsdp2_job() -> tuple[str, str]:
    """An FSDP2 Accelerator preparing a model and its optimizer."""

    def make() -> None:
        accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
        model = torch.nn.Linear(4, 4)
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))

    return _attempt(make)


def fsdp1_job() -> tuple[str, str]:
    """The alternative the FSDP2 refusal names: FSDP1 trains a step."""

    def make() -> None:
        accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1))
        model = torch.nn.Linear(4, 4)
        model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        accelerator.backward(model(torch.ones(2, 4)).sum())
        optimizer.step()

    return _attempt(make)


def mesh_job() -> tuple[str, str]:
    """An Accelerator on a 2-process ``dp_shard`` device mesh."""
    return _attempt(lambda: Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2)))
