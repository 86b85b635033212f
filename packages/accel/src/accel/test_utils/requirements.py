"""Skip decorators for tests that need an optional library or a device family.

Each one is a :func:`unittest.skipUnless` (which pytest honours too) with a reason naming what is
missing. Device families accel has no backend for (MLU, NPU, MUSA, SDAA, HPU) are checked with
``accel.utils``'s detection, so these tests skip everywhere accel runs.
"""

from __future__ import annotations

import unittest
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from accel.availability import (
    is_aim_available,
    is_bnb_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_fp8_available,
    is_habana_gaudi1,
    is_hpu_available,
    is_import_timer_available,
    is_matplotlib_available,
    is_mlflow_available,
    is_mlu_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_pandas_available,
    is_peft_available,
    is_schedulefree_available,
    is_sdaa_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_timm_available,
    is_torch_version,
    is_torchao_available,
    is_torchdata_stateful_dataloader_available,
    is_trackio_available,
    is_transformer_engine_available,
    is_transformer_engine_mxfp8_available,
    is_transformers_available,
    is_triton_available,
    is_wandb_available,
    is_xpu_available,
)

T = TypeVar("T", bound=Callable[..., Any])


def _when(condition: bool, reason: str) -> Callable[[T], T]:
    return unittest.skipUnless(condition, reason)


def _has_pipelining() -> bool:
    """Whether torch has ``torch.distributed.pipelining`` (pipeline parallelism, torch >= 2.4)."""
    try:
        import torch.distributed.pipelining  # noqa: F401
    except ImportError:
        return False
    return True


def require_bnb(test_case: T) -> T:
    """Run only with bitsandbytes installed."""
    return _when(is_bnb_available(), "test requires bitsandbytes")(test_case)


def require_huggingface_suite(test_case: T) -> T:
    """Run only with Hugging Face transformers and datasets installed."""
    return _when(
        is_transformers_available() and is_datasets_available(),
        "test requires transformers and datasets",
    )(test_case)


def require_transformers(test_case: T) -> T:
    """Run only with Hugging Face transformers installed."""
    return _when(is_transformers_available(), "test requires transformers")(test_case)


def require_datasets(test_case: T) -> T:
    """Run only with Hugging Face datasets installed."""
    return _when(is_datasets_available(), "test requires datasets")(test_case)


def require_deepspeed(test_case: T) -> T:
    """Run only with DeepSpeed installed."""
    return _when(is_deepspeed_available(), "test requires deepspeed (accel[deepspeed])")(test_case)


def require_tensorboard(test_case: T) -> T:
    """Run only with a TensorBoard writer installed."""
    return _when(is_tensorboard_available(), "test requires tensorboard")(test_case)


def require_wandb(test_case: T) -> T:
    """Run only with Weights & Biases installed."""
    return _when(is_wandb_available(), "test requires wandb")(test_case)


def require_mlflow(test_case: T) -> T:
    """Run only with MLflow installed."""
    return _when(is_mlflow_available(), "test requires mlflow")(test_case)


def require_torchdata_stateful_dataloader(test_case: T) -> T:
    """Run only with ``torchdata.stateful_dataloader`` installed."""
    return _when(
        is_torchdata_stateful_dataloader_available(),
        "test requires torchdata.stateful_dataloader",
    )(test_case)


def require_torchao(test_case: T) -> T:
    """Run only with torchao installed."""
    return _when(is_torchao_available(), "test requires torchao")(test_case)


def require_transformer_engine(test_case: T) -> T:
    """Run only with NVIDIA Transformer Engine installed."""
    return _when(is_transformer_engine_available(), "test requires Transformer Engine")(test_case)


def require_transformer_engine_mxfp8(test_case: T) -> T:
    """Run only where Transformer Engine's MXFP8 recipe can run (installed, with a GPU)."""
    return _when(is_transformer_engine_mxfp8_available(), "test requires Transformer Engine MXFP8")(
        test_case
    )


def require_fp8(test_case: T) -> T:
    """Run only with an fp8 backend library installed (Transformer Engine, torchao or MS-AMP)."""
    return _when(is_fp8_available(), "test requires an fp8 backend library")(test_case)


def require_pippy(test_case: T) -> T:
    """Run only where torch has pipeline parallelism (``torch.distributed.pipelining``)."""
    return _when(
        _has_pipelining() and not is_habana_gaudi1(), "test requires torch.distributed.pipelining"
    )(test_case)


def require_fsdp2(test_case: T) -> T:
    """Run only where torch has FSDP2 (``torch.distributed.fsdp.fully_shard``)."""
    import torch.distributed.fsdp as fsdp

    return _when(hasattr(fsdp, "fully_shard"), "test requires FSDP2 (fully_shard)")(test_case)


def require_non_xpu(test_case: T) -> T:
    """Run only without an Intel XPU."""
    return _when(not is_xpu_available(), "test requires a machine without an XPU")(test_case)


def require_non_hpu(test_case: T) -> T:
    """Run only without an Intel Gaudi HPU."""
    return _when(not is_hpu_available(), "test requires a machine without an HPU")(test_case)


def require_cuda_or_xpu(test_case: T) -> T:
    """Run only with a CUDA GPU or an Intel XPU."""
    return _when(is_cuda_available() or is_xpu_available(), "test requires a GPU or an XPU")(
        test_case
    )


def require_cuda_or_hpu(test_case: T) -> T:
    """Run only with a CUDA GPU or an Intel Gaudi HPU."""
    return _when(is_cuda_available() or is_hpu_available(), "test requires a GPU or an HPU")(
        test_case
    )


def require_single_xpu(test_case: T) -> T:
    """Run only with exactly one Intel XPU."""
    one = is_xpu_available() and torch.xpu.device_count() == 1
    return _when(one, "test requires one XPU")(test_case)


def require_multi_xpu(test_case: T) -> T:
    """Run only with several Intel XPUs."""
    several = is_xpu_available() and torch.xpu.device_count() > 1
    return _when(several, "test requires several XPUs")(test_case)


def require_multi_gpu_or_xpu(test_case: T) -> T:
    """Run only with several CUDA GPUs or several Intel XPUs."""
    gpus = is_cuda_available() and torch.cuda.device_count() > 1
    xpus = is_xpu_available() and torch.xpu.device_count() > 1
    return _when(gpus or xpus, "test requires several GPUs or XPUs")(test_case)


def require_mlu(test_case: T) -> T:
    """Run only with a Cambricon MLU."""
    return _when(is_mlu_available(), "test requires an MLU")(test_case)


def require_npu(test_case: T) -> T:
    """Run only with an Ascend NPU."""
    return _when(is_npu_available(), "test requires an NPU")(test_case)


def require_musa(test_case: T) -> T:
    """Run only with a Moore Threads MUSA device."""
    return _when(is_musa_available(), "test requires a MUSA device")(test_case)


def require_sdaa(test_case: T) -> T:
    """Run only with a Tecorigin SDAA device."""
    return _when(is_sdaa_available(), "test requires an SDAA device")(test_case)


def require_peft(test_case: T) -> T:
    """Run only with PEFT installed."""
    return _when(is_peft_available(), "test requires peft")(test_case)


def require_neuron(test_case: T) -> T:
    """Run only with an AWS Neuron device."""
    return _when(is_neuron_available(), "test requires a Neuron device")(test_case)


def require_timm(test_case: T) -> T:
    """Run only with timm installed."""
    return _when(is_timm_available(), "test requires timm")(test_case)


def require_triton(test_case: T) -> T:
    """Run only with Triton installed."""
    return _when(is_triton_available(), "test requires triton")(test_case)


def require_schedulefree(test_case: T) -> T:
    """Run only with schedulefree installed."""
    return _when(is_schedulefree_available(), "test requires schedulefree")(test_case)


def require_tp(test_case: T) -> T:
    """Run only where tensor parallelism works (torch >= 2.3 and transformers >= 4.52)."""
    from accel.versions import compare_versions

    ready = (
        is_torch_version(">=", "2.3.0")
        and is_transformers_available()
        and compare_versions("transformers", ">=", "4.52.0")
    )
    return _when(ready, "test requires torch >= 2.3.0 and transformers >= 4.52.0")(test_case)


def require_trackio(test_case: T) -> T:
    """Run only with trackio installed."""
    return _when(is_trackio_available(), "test requires trackio")(test_case)


def require_comet_ml(test_case: T) -> T:
    """Run only with comet_ml installed."""
    return _when(is_comet_ml_available(), "test requires comet_ml")(test_case)


def require_aim(test_case: T) -> T:
    """Run only with Aim installed."""
    return _when(is_aim_available(), "test requires aim")(test_case)


def require_clearml(test_case: T) -> T:
    """Run only with ClearML installed."""
    return _when(is_clearml_available(), "test requires clearml")(test_case)


def require_dvclive(test_case: T) -> T:
    """Run only with DVCLive installed."""
    return _when(is_dvclive_available(), "test requires dvclive")(test_case)


def require_swanlab(test_case: T) -> T:
    """Run only with SwanLab installed."""
    return _when(is_swanlab_available(), "test requires swanlab")(test_case)


def require_pandas(test_case: T) -> T:
    """Run only with pandas installed."""
    return _when(is_pandas_available(), "test requires pandas")(test_case)


def require_matplotlib(test_case: T) -> T:
    """Run only with matplotlib installed."""
    return _when(is_matplotlib_available(), "test requires matplotlib")(test_case)


def require_import_timer(test_case: T) -> T:
    """Run only with the ``import_timer`` package (tuna's import-time profile reader) installed."""
    return _when(is_import_timer_available(), "test requires import_timer")(test_case)


def _tracker_available() -> bool:
    """Whether an offline-capable tracker is installed and comet_ml (needs an account) is not."""
    offline = (
        is_wandb_available()
        or is_tensorboard_available()
        or is_trackio_available()
        or is_swanlab_available()
    )
    return offline and not is_comet_ml_available()


def require_trackers(test_case: T) -> T:
    """Run only with at least one offline-capable tracker installed and comet_ml not installed."""
    return _when(
        _tracker_available(),
        "test requires at least one tracker to be available and for `comet_ml` to not be installed",
    )(test_case)
