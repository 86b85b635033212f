"""``DiLoCoSettings``: DiLoCo and streaming DiLoCo across replica groups (``LocalSGD(diloco=...)``).

DiLoCo (https://arxiv.org/abs/2311.08105) trains each replica group on its own for a number of
inner optimizer steps, then averages the groups' *pseudo-gradients* (the parameters at the last
sync minus the parameters now) and applies them with an *outer* optimizer. Streaming DiLoCo
(https://arxiv.org/abs/2501.18512) splits the model into fragments that are synced in turn.
The algorithm is torchft's (``torchft.local_sgd.DiLoCo``); accel drives it from
:class:`accel.local_sgd.LocalSGD` in jobs started with ``accel launch --ft_replicas N``.

Example:
    >>> from accel.local_sgd import LocalSGD
    >>> from accel.utils import DiLoCoSettings
    >>> with LocalSGD(accelerator, model, local_sgd_steps=8, diloco=DiLoCoSettings()) as local_sgd:
    ...     for batch in dataloader:
    ...         ...
    ...         optimizer.step()
    ...         local_sgd.step()
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Callable
from typing import NoReturn

import torch

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError

#: Builds an outer optimizer over a fragment's parameters.
OuterOptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


@dataclasses.dataclass
class DiLoCoSettings:
    """Settings of DiLoCo (and streaming DiLoCo) across replica groups.

    Example:
        >>> settings = DiLoCoSettings(outer_lr=0.7, fragments=2, fragment_sync_delay=1)
        >>> local_sgd = LocalSGD(accelerator, model, local_sgd_steps=8, diloco=settings)

    Attributes:
        outer_lr: Learning rate of the outer optimizer (``torch.optim.SGD``).
        outer_momentum: Momentum of the outer SGD, in ``[0, 1)``.
        nesterov: Nesterov momentum for the outer SGD (needs ``outer_momentum > 0``).
        outer_optimizer: Builds the outer optimizer from a fragment's parameters; when given,
            ``outer_lr``, ``outer_momentum`` and ``nesterov`` are not used.
        fragments: Streaming DiLoCo: the model's top-level children are split into this many
            fragments (in order), and one fragment is synced every
            ``local_sgd_steps // fragments`` inner steps; 1 is plain DiLoCo.
        fragment_sync_delay: Inner steps between starting a fragment's pseudo-gradient
            average and applying it (the all-reduce overlaps training); below
            ``local_sgd_steps // fragments``.
        fragment_update_alpha: How much of the local parameters is mixed into the synced
            fragment (0: the synced parameters only; 1: the local ones), in ``[0, 1]``.
        quantize: Quantize the pseudo-gradients for the all-reduce (torchft's
            ``should_quantize``; needs CUDA and triton).

    Raises:
        AcceleratorConfigError: A field is out of range, naming the value and the fix.
    """

    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    outer_optimizer: OuterOptimizerFactory | None = None
    fragments: int = 1
    fragment_sync_delay: int = 0
    fragment_update_alpha: float = 0.0
    quantize: bool = False

    def __post_init__(self) -> None:
        _number(self.outer_lr, "outer_lr", "a positive learning rate such as 0.7")
        if self.outer_lr <= 0:
            _refuse("outer_lr", self.outer_lr, "must be > 0; the default is 0.7")
        _number(self.outer_momentum, "outer_momentum", "a momentum in [0, 1) such as 0.9")
        if not 0 <= self.outer_momentum < 1:
            _refuse("outer_momentum", self.outer_momentum, "must be in [0, 1); default 0.9")
        for name in ("nesterov", "quantize"):
            if not isinstance(getattr(self, name), bool):
                _refuse(name, getattr(self, name), "must be True or False")
        if self.nesterov and self.outer_momentum == 0 and self.outer_optimizer is None:
            _refuse(
                "nesterov",
                self.nesterov,
                "needs outer_momentum > 0 (Nesterov momentum without momentum is undefined); "
                "set outer_momentum (default 0.9) or nesterov=False",
            )
        if self.outer_optimizer is not None and not callable(self.outer_optimizer):
            _refuse(
                "outer_optimizer",
                self.outer_optimizer,
                "must be a callable taking a list of parameters and returning an optimizer, "
                "e.g. lambda params: torch.optim.SGD(params, lr=0.7, momentum=0.9, "
                "nesterov=True); or None",
            )
        for name, lowest in (("fragments", 1), ("fragment_sync_delay", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                _refuse(name, value, f"must be a whole number >= {lowest}")
        _number(self.fragment_update_alpha, "fragment_update_alpha", "a number in [0, 1]")
        if not 0 <= self.fragment_update_alpha <= 1:
            _refuse("fragment_update_alpha", self.fragment_update_alpha, "must be in [0, 1]")

    def inner_steps_per_sync(self, local_sgd_steps: int) -> int:
        """Inner steps between two syncs (one fragment each), checked against the settings.

        Raises:
            AcceleratorConfigError: ``local_sgd_steps`` is not a multiple of ``fragments``, or
                ``fragment_sync_delay`` does not fit between two syncs.
        """
        if local_sgd_steps % self.fragments != 0:
            raise AcceleratorConfigError(
                f"LocalSGD(local_sgd_steps={local_sgd_steps}) with DiLoCoSettings(fragments="
                f"{self.fragments}): each fragment syncs every local_sgd_steps // fragments "
                "inner steps, so local_sgd_steps must be a multiple of fragments (e.g. "
                f"local_sgd_steps={self.fragments * max(1, local_sgd_steps // self.fragments)})."
            )
        per_sync = local_sgd_steps // self.fragments
        if self.fragment_sync_delay >= per_sync:
            raise AcceleratorConfigError(
                f"DiLoCoSettings(fragment_sync_delay={self.fragment_sync_delay}) with "
                f"local_sgd_steps={local_sgd_steps} and fragments={self.fragments}: a fragment's "
                f"average must be applied before the next sync, {per_sync} inner steps later; "
                f"set fragment_sync_delay below {per_sync} or raise local_sgd_steps."
            )
        return per_sync

    def check_device(self, device: torch.device) -> None:
        """Refuse ``quantize=True`` where torchft cannot quantize.

        Raises:
            UnsupportedFeatureError: ``quantize`` on a device other than CUDA, or without triton.
        """
        if not self.quantize:
            return
        if device.type != "cuda":
            raise UnsupportedFeatureError(
                f"DiLoCoSettings(quantize=True) on a {device.type} job: torchft's quantized "
                "all-reduce of the pseudo-gradients needs CUDA and triton. Set quantize=False "
                "(the default), or run the replica groups on CUDA GPUs with triton installed."
            )
        if importlib.util.find_spec("triton") is None:
            raise UnsupportedFeatureError(
                "DiLoCoSettings(quantize=True) needs triton for torchft's quantized all-reduce "
                "(without it torchft silently sends full precision). Install triton (pip "
                "install triton), or set quantize=False."
            )

    def build_outer_optimizer(self, parameters: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        """The outer optimizer of one fragment: ``outer_optimizer`` or Nesterov SGD.

        Raises:
            AcceleratorConfigError: ``outer_optimizer`` returned something else than an optimizer.
        """
        if self.outer_optimizer is None:
            return torch.optim.SGD(
                parameters,
                lr=self.outer_lr,
                momentum=self.outer_momentum,
                nesterov=self.nesterov,
            )
        built = self.outer_optimizer(parameters)
        if not isinstance(built, torch.optim.Optimizer):
            raise AcceleratorConfigError(
                f"DiLoCoSettings(outer_optimizer={self.outer_optimizer!r}) returned "
                f"{type(built).__name__}, not a torch.optim.Optimizer; return an optimizer "
                "over the parameters it is given."
            )
        return built


def split_into_fragments(model: torch.nn.Module, fragments: int) -> list[torch.nn.Module]:
    """The model's top-level children in ``fragments`` consecutive groups (plain DiLoCo: the model).

    Parameters held by ``model`` itself (not by a child) go with the first fragment.

    Example:
        >>> parts = split_into_fragments(torch.nn.Sequential(a, b, c, d), 2)  # [a, b], [c, d]

    Raises:
        AcceleratorConfigError: Fewer top-level children with parameters than ``fragments``.
    """
    if fragments == 1:
        return [model]
    children = [child for child in model.children() if any(True for _ in child.parameters())]
    if len(children) < fragments:
        raise AcceleratorConfigError(
            f"DiLoCoSettings(fragments={fragments}): the model has {len(children)} top-level "
            f"children with parameters ({type(model).__name__}), and each fragment takes whole "
            f"children; use fragments <= {max(len(children), 1)}."
        )
    own = list(model.named_parameters(recurse=False))
    parts: list[torch.nn.Module] = []
    for index in range(fragments):
        begin = index * len(children) // fragments
        end = (index + 1) * len(children) // fragments
        part = torch.nn.ModuleList(children[begin:end])
        if index == 0:
            for name, parameter in own:
                part.register_parameter(f"own_{name}", parameter)
        parts.append(part)
    return parts


def _number(value: object, name: str, expected: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _refuse(name, value, f"must be {expected}")


def _refuse(name: str, value: object, fix: str) -> NoReturn:
    raise AcceleratorConfigError(f"DiLoCoSettings({name}={value!r}): {fix}.")
