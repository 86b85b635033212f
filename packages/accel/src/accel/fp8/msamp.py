"""fp8 training through Microsoft's MS-AMP (``msamp.initialize``), on fp8-capable GPUs.

MS-AMP converts a model and its optimizer together, so this precision object takes the one
model and the one optimizer of a ``prepare`` call before anything else is prepared. It keeps a
loss scaler, as MS-AMP needs, and bf16 autocast. It is refused up front when MS-AMP is not
installed, the device has no fp8 tensor cores, or the job uses FSDP.
"""

from __future__ import annotations

from typing import Any

import torch

from accel.errors import PreparationError, UnsupportedFeatureError
from accel.fp8.capability import fp8_device_problem, require_package
from accel.fp8.recipes import MSAMPRecipeKwargs
from accel.precision import FP16Precision
from accel_state import DistributedType, PrecisionType

MSAMP_INSTALL = (
    "install MS-AMP from its repository (github.com/Azure/MS-AMP) on a CUDA machine; it is not "
    "on PyPI"
)


class MSAMPPrecision(FP16Precision):
    """MS-AMP's fp8 model and optimizer, bf16 autocast, dynamic loss scaling.

    Raises:
        UnsupportedFeatureError: MS-AMP is missing, the device cannot run fp8, or FSDP is used.
    """

    mode = PrecisionType.FP8
    backend = "MSAMP"
    autocast_dtype = torch.bfloat16

    def __init__(
        self, device: torch.device, recipe: MSAMPRecipeKwargs, distributed_type: DistributedType
    ) -> None:
        if distributed_type is DistributedType.FSDP:
            raise UnsupportedFeatureError(
                "mixed_precision='fp8' with MS-AMP does not work with FSDP (MS-AMP replaces the "
                "optimizer FSDP shards); use DDP, or the torchao backend (--fp8_backend ao)."
            )
        if device.type != "cuda":
            raise UnsupportedFeatureError(
                f"mixed_precision='fp8' with MS-AMP needs a CUDA GPU with compute capability "
                f"8.9+, but this process runs on {device.type}. Use the torchao backend "
                "(AORecipeKwargs / --fp8_backend ao), which also runs on the CPU."
            )
        require_package("msamp", "msamp", "MS-AMP", MSAMP_INSTALL)
        problem = fp8_device_problem(device)
        if problem is not None:
            raise UnsupportedFeatureError(
                f"mixed_precision='fp8' with MS-AMP cannot run here: {problem}."
            )
        super().__init__(device)
        self.recipe = recipe

    def prepare_together(self, objects: list[Any]) -> list[Any]:
        """Replace the call's model and optimizer by MS-AMP's (``msamp.initialize``).

        Raises:
            PreparationError: The call does not hold exactly one model and one optimizer.
        """
        models = [i for i, obj in enumerate(objects) if isinstance(obj, torch.nn.Module)]
        optimizers = [i for i, obj in enumerate(objects) if isinstance(obj, torch.optim.Optimizer)]
        if not models and not optimizers:
            return objects
        if len(models) != 1 or len(optimizers) != 1:
            raise PreparationError(
                f"MS-AMP converts one model and its optimizer together; this prepare() call has "
                f"{len(models)} model(s) and {len(optimizers)} optimizer(s). Pass exactly one of "
                "each in the same call."
            )
        import msamp

        model, optimizer = msamp.initialize(
            objects[models[0]], objects[optimizers[0]], opt_level=self.recipe.opt_level
        )
        result = list(objects)
        result[models[0]], result[optimizers[0]] = model, optimizer
        return result


__all__ = ["MSAMP_INSTALL", "MSAMPPrecision"]
