"""Moving a model to its device without losing tied weights or the optimizer's parameters.

On CUDA and the CPU ``module.to(device)`` keeps each ``Parameter`` object and swaps its data. On
XLA it creates new ``Parameter`` objects, one per module that holds a parameter: tied weights come
apart, and an optimizer built before ``prepare`` still points at the old host tensors (it would
step them while the model trains with the device copies, so the loss never falls).
:func:`move_model` re-ties and records the replacements; :func:`switch_parameters` applies them
to an optimizer.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

#: ``id(old parameter) -> (weak reference to it, its replacement)``.
ParameterMoves = dict[int, tuple["weakref.ref[torch.Tensor]", torch.nn.Parameter]]


def move_model(model: torch.nn.Module, device: torch.device) -> ParameterMoves:
    """``model.to(device)`` in place, keeping tied parameters tied.

    Returns:
        The parameters that were replaced by new objects (empty where ``.to`` kept them).

    """
    slots = [
        (module, name, parameter)
        for module in model.modules()
        for name, parameter in module._parameters.items()
        if parameter is not None
    ]
    model.to(device)
    moves: ParameterMoves = {}
    for module, name, old in slots:
        new = module._parameters[name]
        assert new is not None
        known = moves.get(id(old))
        if known is not None:
            if new is not known[1]:
                module._parameters[name] = known[1]  # tied before the move: tie again
        elif new is not old:
            moves[id(old)] = (weakref.ref(old), new)
    return moves


def switch_parameters(optimizer: torch.optim.Optimizer, moves: ParameterMoves) -> int:
    """Point ``optimizer``'s parameter groups and state at the moved parameters.

    Returns:
        How many parameters were switched.

    """
    if not moves:
        return 0

    def moved(parameter: Any) -> Any:
        entry = moves.get(id(parameter))
        return entry[1] if entry is not None and entry[0]() is parameter else parameter

    switched = 0
    for group in optimizer.param_groups:
        params = group["params"]
        replaced = [moved(parameter) for parameter in params]
        switched += sum(new is not old for new, old in zip(replaced, params, strict=True))
        group["params"] = replaced
    for parameter in list(optimizer.state):
        target = moved(parameter)
        if target is not parameter:
            optimizer.state[target] = optimizer.state.pop(parameter)
    return switched
