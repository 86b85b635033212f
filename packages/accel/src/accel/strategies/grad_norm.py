"""Gradient norms and clipping over parameters that live on several device meshes.

After tensor parallelism and FSDP2, a model's gradients are DTensors on different meshes (the
2-D ``dp_shard x tp`` mesh for split layers, the 1-D ``dp_shard`` mesh for the rest) or plain
tensors; torch's ``clip_grad_norm_`` stacks their norms and fails across meshes. Here each group
of gradients sharing a mesh and placements is reduced on its own (``full_tensor``: the norm over
every dimension of its mesh), the groups are combined, and each group is scaled on its own mesh.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from accel_state.torch_compat import is_dtensor


def _groups(parameters: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Gradients grouped by (mesh, placements); plain tensors form one group."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for parameter in parameters:
        grad = parameter.grad
        if grad is None:
            continue
        sharded: Any = grad
        key = (sharded.device_mesh, tuple(sharded.placements)) if is_dtensor(grad) else None
        groups.setdefault(key, []).append(grad)
    return list(groups.values())


def _full(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's global value (a collective over its mesh); a plain tensor as it is."""
    full = getattr(value, "full_tensor", None)
    if full is None:
        return value
    result: torch.Tensor = full()
    return result


def total_norm(parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type`` norm of every gradient of ``parameters``, over every mesh dimension."""
    groups = _groups(parameters)
    if not groups:
        return torch.zeros(())
    norms = [_full(torch.nn.utils.get_total_norm(group, norm_type)) for group in groups]
    device = norms[0].device
    stacked = torch.stack([norm.to(device) for norm in norms])
    result: torch.Tensor = (
        stacked.max() if math.isinf(norm_type) else torch.linalg.vector_norm(stacked, norm_type)
    )
    return result


def clip_grad_norm(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """Scale the gradients so their total norm is at most ``max_norm``; returns the norm before."""
    parameters = list(parameters)
    norm = total_norm(parameters, norm_type)
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for group in _groups(parameters):
        torch._foreach_mul_(group, coefficient.to(group[0].device))
    return norm
