"""Tensor parallelism for any torch model: a plan of module-name patterns to styles.

The plan is applied with ``torch.distributed.tensor.parallel.parallelize_module`` on the mesh's
``tp`` dimension. It comes from ``TorchTensorParallelConfig(plan=...)`` or the model's own
``tp_plan`` / ``_tp_plan`` attribute (the attribute transformers models carry), in transformers'
style vocabulary:

=======================  ===============================================================
``"colwise"``            ``ColwiseParallel()``: output features split, output sharded on the
                         last dimension
``"rowwise"``            ``RowwiseParallel()``: input features split, output all-reduced
``"colwise_rep"``        ``ColwiseParallel(output_layouts=Replicate())``: output gathered
``"rowwise_rep"``        ``RowwiseParallel(input_layouts=Replicate())``: input split locally
``"sequence_parallel"``  ``SequenceParallel()``: norms/dropout on sequence shards (dim 1)
``"replicate"``          :class:`ReplicateParallel`: parameters replicated on the ``tp`` mesh
=======================  ===============================================================

A style may also be a dict ``{"style": <name>, "input_layouts": ..., "output_layouts": ...,
"use_local_output": ...}`` (layouts ``"replicate"`` or ``"shard(<dim>)"``, or ``Placement``
objects) or any torch ``ParallelStyle`` (``PrepareModuleInput``...). A pattern is a dotted module
path where ``*`` matches one name component; every pattern must match a module. A model whose
parameters are already DTensors (transformers' ``from_pretrained(tp_plan="auto")``) is accepted as
it is.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.tensor.parallel import ParallelStyle

from accel.errors import AcceleratorConfigError

STYLE_NAMES = (
    "colwise",
    "rowwise",
    "colwise_rep",
    "rowwise_rep",
    "sequence_parallel",
    "replicate",
)
_SHARD = re.compile(r"^shard\((-?\d+)\)$")


def is_split(model: torch.nn.Module) -> bool:
    """Whether some parameter of ``model`` is already a DTensor (split or placed on a mesh)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def model_plan(model: torch.nn.Module) -> Mapping[str, Any] | None:
    """The model's own plan: its ``tp_plan`` attribute, else ``_tp_plan`` (transformers)."""
    for name in ("tp_plan", "_tp_plan"):
        plan = getattr(model, name, None)
        if isinstance(plan, Mapping) and plan:
            return plan
    return None


def _layout(key: str, value: Any) -> Any:
    """``"replicate"`` / ``"shard(d)"`` / a ``Placement`` as a ``Placement``."""
    from torch.distributed.tensor import Placement, Replicate, Shard

    if value is None or isinstance(value, Placement):
        return value
    text = str(value).strip().lower().replace(" ", "")
    if text == "replicate":
        return Replicate()
    match = _SHARD.match(text)
    if match:
        return Shard(int(match.group(1)))
    raise AcceleratorConfigError(
        f"tp plan entry {key!r}: layout {value!r} is not known; write 'replicate' or "
        "'shard(<dim>)' (e.g. 'shard(1)'), or pass a torch Placement."
    )


def _named_style(key: str, name: str, options: Mapping[str, Any]) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    layouts: dict[str, Any] = {
        option: _layout(key, options[option])
        for option in ("input_layouts", "output_layouts")
        if option in options
    }
    extra: dict[str, Any] = {}
    if "use_local_output" in options:
        extra["use_local_output"] = bool(options["use_local_output"])
    if name == "colwise":
        return ColwiseParallel(**layouts, **extra)
    if name == "rowwise":
        return RowwiseParallel(**layouts, **extra)
    if name == "colwise_rep":
        return ColwiseParallel(**{"output_layouts": Replicate(), **layouts}, **extra)
    if name == "rowwise_rep":
        return RowwiseParallel(**{"input_layouts": Replicate(), **layouts}, **extra)
    if name == "sequence_parallel":
        if layouts:
            raise AcceleratorConfigError(
                f"tp plan entry {key!r}: sequence_parallel takes no layouts (use "
                "'sequence_dim' / 'use_local_output'); it shards the sequence dimension."
            )
        return SequenceParallel(sequence_dim=int(options.get("sequence_dim", 1)), **extra)
    if layouts or extra:
        raise AcceleratorConfigError(
            f"tp plan entry {key!r}: 'replicate' takes no layouts; it keeps the module whole."
        )
    return ReplicateParallel()


def parse_style(key: str, value: Any) -> Any:
    """One plan entry as a torch ``ParallelStyle``.

    Raises:
        AcceleratorConfigError: An unknown style name, option or layout (the message lists them).
    """
    if isinstance(value, ParallelStyle):
        return value
    if isinstance(value, str):
        name, options = value, {}
    elif isinstance(value, Mapping) and "style" in value:
        name, options = str(value["style"]), {k: v for k, v in value.items() if k != "style"}
        known = {"input_layouts", "output_layouts", "use_local_output", "sequence_dim"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise AcceleratorConfigError(
                f"tp plan entry {key!r}: unknown option(s) {unknown}; known: {sorted(known)}."
            )
    else:
        raise AcceleratorConfigError(
            f"tp plan entry {key!r}: {value!r} is not a style; give one of "
            f"{', '.join(STYLE_NAMES)}, a dict with 'style', or a torch ParallelStyle."
        )
    name = name.strip().lower()
    if name not in STYLE_NAMES:
        raise AcceleratorConfigError(
            f"tp plan entry {key!r}: style {name!r} is not supported; choose one of "
            f"{', '.join(STYLE_NAMES)}, or pass a torch ParallelStyle."
        )
    return _named_style(key, name, options)


def _matches(pattern: str, name: str) -> bool:
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(
        fnmatch.fnmatchcase(part, glob) for part, glob in zip(names, parts, strict=True)
    )


def resolve_plan(model: torch.nn.Module, plan: Mapping[str, Any]) -> dict[str, Any]:
    """Expand ``plan``'s patterns to the model's module names, styles parsed.

    Raises:
        AcceleratorConfigError: A pattern matches no module, two patterns match one module, or a
            style is invalid.
    """
    names = [name for name, _ in model.named_modules() if name]
    resolved: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for pattern, value in plan.items():
        style = parse_style(pattern, value)
        matched = [name for name in names if _matches(pattern, name)]
        if not matched:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise AcceleratorConfigError(
                f"tp plan key {pattern!r} matches no module of {type(model).__name__} (its "
                f"modules: {shown}). Keys are dotted module paths; '*' matches one component, "
                "as in 'blocks.*.attn.q'."
            )
        for name in matched:
            if name in resolved:
                raise AcceleratorConfigError(
                    f"tp plan keys {origin[name]!r} and {pattern!r} both match module {name!r}; "
                    "give each module one style."
                )
            resolved[name], origin[name] = style, pattern
    return resolved


class TensorParallel:
    """Applies a tensor-parallel plan on the ``tp`` mesh (``parallelize_module``).

    Args:
        tp_mesh: The mesh's ``tp`` dimension.
        plan: ``TorchTensorParallelConfig.plan``; ``None``: each model's ``tp_plan``.
    """

    def __init__(self, tp_mesh: Any, plan: Mapping[str, Any] | None = None) -> None:
        self.tp_mesh = tp_mesh
        self.plan = plan

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """Split ``model`` in place (a model already on a mesh is left as it is).

        Raises:
            AcceleratorConfigError: No plan anywhere, or a plan that does not fit the model.
        """
        if is_split(model):
            return model
        plan = self.plan if self.plan is not None else model_plan(model)
        if not plan:
            raise AcceleratorConfigError(
                f"tp_size={self.tp_mesh.size()} needs a tensor-parallel plan for "
                f"{type(model).__name__}: pass ParallelismConfig(tp_handler="
                "TorchTensorParallelConfig(plan={'blocks.*.mlp.up': 'colwise', "
                "'blocks.*.mlp.down': 'rowwise', ...})), or give the model a tp_plan attribute."
            )
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, self.tp_mesh, resolve_plan(model, plan))
        return model


class ReplicateParallel(ParallelStyle):
    """Keep a module whole on every ``tp`` rank, its parameters as replicated DTensors.

    Inputs become replicated DTensors and outputs local tensors again, so the module sits
    between split ones like any other. (transformers' ``"replicate"`` style.)
    """

    def _apply(self, module: torch.nn.Module, device_mesh: Any) -> torch.nn.Module:
        from torch.distributed.tensor import DTensor, Replicate, distribute_module

        def to_replicated(_: torch.nn.Module, inputs: Any, mesh: Any) -> Any:
            return tuple(
                DTensor.from_local(item, mesh, [Replicate()], run_check=False)
                if isinstance(item, torch.Tensor) and not isinstance(item, DTensor)
                else item
                for item in inputs
            )

        def to_local(_: torch.nn.Module, outputs: Any, mesh: Any) -> Any:
            if isinstance(outputs, DTensor):
                return outputs.to_local()
            if isinstance(outputs, tuple):
                return tuple(o.to_local() if isinstance(o, DTensor) else o for o in outputs)
            return outputs

        return distribute_module(module, device_mesh, input_fn=to_replicated, output_fn=to_local)
