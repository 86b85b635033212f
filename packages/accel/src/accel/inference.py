"""Pipeline-parallel inference (Accelerate's ``prepare_pippy``) on ``torch.distributed.pipelining``.

The model is traced once (``torch.export``) with an example micro-batch, cut into one stage per
process at its split points, and run with torch's GPipe schedule: process 0 feeds the batch in
``num_chunks`` micro-batches, each process runs its stage as soon as the previous one sends its
activations, and the last process holds the output (every process with ``gather_output``). It
runs on CUDA (NCCL) and on the CPU over gloo.

Example:
    >>> model = prepare_pippy(model, example_args=(batch[:1],))  # doctest: +SKIP
    >>> with torch.no_grad():
    ...     output = model(batch)  # the output on the last process, None elsewhere
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from accel.errors import AcceleratorConfigError
from accel_ckpt.big_modeling import infer_auto_device_map
from accel_ckpt.big_modeling.model_helpers import calculate_maximum_sizes
from accel_ckpt.sizes import convert_bytes
from accel_ops import copy_tensor_to_devices, ignorant_find_batch_size, send_to_device
from accel_state import PartialState


def _units(module: torch.nn.Module, prefix: str, keep_whole: set[str]) -> list[tuple[str, int]]:
    """Modules a pipeline may start a stage at, in registration order, with their sizes."""
    children = list(module.named_children())
    if not children or type(module).__name__ in keep_whole:
        size = sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])
        return [(prefix, size)] if prefix else []
    units: list[tuple[str, int]] = []
    for name, child in children:
        units.extend(_units(child, f"{prefix}.{name}" if prefix else name, keep_whole))
    return units


def generate_split_points(
    model: torch.nn.Module,
    num_stages: int,
    no_split_module_classes: Sequence[str] | None = None,
) -> list[str]:
    """``num_stages - 1`` module names that cut ``model`` into stages of about equal size.

    Leaf modules and modules of ``no_split_module_classes`` are kept whole; a stage starts at
    the first module lying mostly past the stage's share of the total size.

    Raises:
        AcceleratorConfigError: The model has fewer such modules than stages.
    """
    units = _units(model, "", set(no_split_module_classes or ()))
    if len(units) < num_stages:
        raise AcceleratorConfigError(
            f"prepare_pippy: {type(model).__name__} has {len(units)} module(s) to start a stage "
            f"at, fewer than the {num_stages} stages (one per process); pass split_points=[...] "
            "or use fewer processes."
        )
    total = sum(size for _, size in units)
    points: list[str] = []
    running = 0
    for index, (name, size) in enumerate(units):
        stage = len(points) + 1
        left = len(units) - index
        past_share = running + size / 2 > total * stage / num_stages
        if index and stage < num_stages and (past_share or left == num_stages - stage):
            points.append(name)
        running += size
    return points


def generate_device_map(
    model: torch.nn.Module,
    num_processes: int = 1,
    no_split_module_classes: Sequence[str] | None = None,
    max_memory: Mapping[object, int | str] | None = None,
) -> dict[str, Any]:
    """A device map that spreads ``model`` over ``num_processes`` pipeline stages (Accelerate's API).

    Without ``max_memory``, each process index gets an equal share of the model's size plus its
    largest layer (what may land on one stage besides its share), rounded up to a whole unit, with
    10% headroom. The map keeps
    every module (``clean_result=False``), so stage boundaries can be read off it.
    """
    if num_processes == 1:
        return dict(
            infer_auto_device_map(
                model, no_split_module_classes=no_split_module_classes, clean_result=False
            )
        )
    if max_memory is None:
        total, (largest, _) = calculate_maximum_sizes(model)
        # Rounded up to a whole unit ("40.6 KB" -> 41 KB), then 10% more, as Accelerate sizes it.
        value, unit = convert_bytes((total + largest) / num_processes).split(" ")
        share = f"{math.ceil(float(value)) * 1.1} {unit}"
        max_memory = dict.fromkeys(range(num_processes), share)
    return dict(
        infer_auto_device_map(
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            clean_result=False,
        )
    )


def find_pippy_batch_size(
    args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
) -> int | None:
    """The batch size of the first positional, then keyword, input that has one; else None."""
    for value in [*(args or ()), *(kwargs or {}).values()]:
        size = ignorant_find_batch_size(value)
        if size is not None:
            return size
    return None


def build_pipeline(
    model: torch.nn.Module,
    split_points: Sequence[str],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    num_chunks: int,
) -> Any:
    """Trace ``model``, keep this process's stage, and return its GPipe schedule."""
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    state = PartialState()
    spec = {point: SplitPoint.BEGINNING for point in split_points}
    pipe = pipeline(model, mb_args=args, mb_kwargs=dict(kwargs or {}), split_spec=spec)
    stage = pipe.build_stage(state.process_index, device=state.device)
    return ScheduleGPipe(stage, num_chunks)


def pippy_forward(
    forward: Any, num_chunks: int, gather_output: bool, *args: Any, **kwargs: Any
) -> Any:
    """One pipelined forward: process 0 feeds the inputs, the last process gets the output.

    ``forward`` is the pipeline's step (called with the inputs on process 0, without on the
    others); a single process calls it with the inputs and returns its output.
    """
    state = PartialState()
    output = None
    if state.num_processes == 1:
        output = forward(*args, **kwargs)
    elif state.is_main_process:
        forward(*args, **kwargs)
    elif state.is_last_process:
        output = forward()
    else:
        forward()
    if gather_output:
        output = copy_tensor_to_devices(output)
    return output


def prepare_pippy(
    model: torch.nn.Module,
    split_points: str | Sequence[str] = "auto",
    no_split_module_classes: Sequence[str] | None = None,
    example_args: tuple[Any, ...] = (),
    example_kwargs: Mapping[str, Any] | None = None,
    num_chunks: int | None = None,
    gather_output: bool = False,
) -> torch.nn.Module:
    """Split ``model`` into one pipeline stage per process for inference (Accelerate's API).

    Args:
        model: The model (whole on every process; each keeps its stage).
        split_points: Module names where stages begin, or ``"auto"`` (stages of equal size).
        no_split_module_classes: Class names kept whole by ``"auto"`` (transformer blocks).
        example_args: Positional inputs of one micro-batch, for tracing.
        example_kwargs: Keyword inputs of one micro-batch.
        num_chunks: Micro-batches per call (default: the number of processes); a batch's size
            must be divisible by it.
        gather_output: Give every process the output (else only the last process has it).

    Returns:
        ``model`` with a pipelined ``forward``; ``model.pippy_stage`` is the schedule and
        ``model.hf_split_points`` the split points.

    Raises:
        AcceleratorConfigError: No example inputs, or too few modules to split at.
    """
    if not example_args and not example_kwargs:
        raise AcceleratorConfigError(
            "prepare_pippy needs example_args (and/or example_kwargs): the inputs of one "
            "micro-batch, which trace the model into stages."
        )
    state = PartialState()
    example_args = send_to_device(tuple(example_args), "cpu")
    example_kwargs = send_to_device(dict(example_kwargs or {}), "cpu")
    chunks = state.num_processes if num_chunks is None else num_chunks
    if split_points == "auto":
        points = generate_split_points(model, state.num_processes, no_split_module_classes)
    else:
        points = [split_points] if isinstance(split_points, str) else list(split_points)
    schedule = build_pipeline(model, points, example_args, example_kwargs, chunks)
    model.__dict__["_original_forward"] = model.forward
    model.pippy_stage = schedule
    model.hf_split_points = points  # type: ignore[assignment]
    forward = functools.partial(pippy_forward, schedule.step, chunks, gather_output)
    model.forward = forward  # type: ignore[method-assign]
    return model


__all__ = [
    "build_pipeline",
    "find_pippy_batch_size",
    "generate_device_map",
    "generate_split_points",
    "pippy_forward",
    "prepare_pippy",
]
