"""``is_*_available`` helpers: which optional libraries and devices this process can use.

Library checks look for an installed distribution without importing it (cheap, cached);
device checks ask torch (imported on first call, so importing ``accel.utils`` stays cheap). Names and signatures follow ``accelerate.utils``.
"""

from __future__ import annotations

import functools
import importlib.util
import operator
import os
import socket
from collections.abc import Callable
from typing import Any, TypeVar

from accel.errors import UnsupportedFeatureError

_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}


@functools.cache
def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (found on the path; not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _library_check(module: str, doc: str) -> Callable[[], bool]:
    def check() -> bool:
        return _installed(module)

    check.__doc__ = f"Whether {doc} is installed (``import {module}`` would work)."
    return check


is_aim_available = _library_check("aim", "Aim")
is_boto3_available = _library_check("boto3", "boto3")
is_clearml_available = _library_check("clearml", "ClearML")
is_comet_ml_available = _library_check("comet_ml", "Comet ML")
is_datasets_available = _library_check("datasets", "Hugging Face datasets")
is_deepspeed_available = _library_check("deepspeed", "DeepSpeed")
is_dvclive_available = _library_check("dvclive", "DVCLive")
is_lomo_available = _library_check("lomo_optim", "LOMO")
is_matplotlib_available = _library_check("matplotlib", "matplotlib")
is_megatron_lm_available = _library_check("megatron", "Megatron-LM")
is_mlflow_available = _library_check("mlflow", "MLflow")
is_msamp_available = _library_check("msamp", "MS-AMP")
is_pandas_available = _library_check("pandas", "pandas")
is_peft_available = _library_check("peft", "PEFT")
is_pippy_available = _library_check("pippy", "PiPPy")
is_pynvml_available = _library_check("pynvml", "pynvml")
is_amdsmi_available = _library_check("amdsmi", "amdsmi")
is_pytest_available = _library_check("pytest", "pytest")
is_rich_available = _library_check("rich", "rich")
is_sagemaker_available = _library_check("sagemaker", "the SageMaker SDK")
is_schedulefree_available = _library_check("schedulefree", "schedulefree")
is_swanlab_available = _library_check("swanlab", "SwanLab")
is_timm_available = _library_check("timm", "timm")
is_torchao_available = _library_check("torchao", "torchao")
is_torchdata_available = _library_check("torchdata", "torchdata")
is_torchvision_available = _library_check("torchvision", "torchvision")
is_trackio_available = _library_check("trackio", "Trackio")
is_transformer_engine_available = _library_check("transformer_engine", "Transformer Engine")
is_transformers_available = _library_check("transformers", "Hugging Face transformers")
is_triton_available = _library_check("triton", "Triton")
is_wandb_available = _library_check("wandb", "Weights & Biases")
is_import_timer_available = _library_check("import_timer", "import-timer")


def is_tensorboard_available() -> bool:
    """Whether a TensorBoard writer is installed (``tensorboard`` or ``tensorboardX``)."""
    return _installed("tensorboard") or _installed("tensorboardX")


def is_torchdata_stateful_dataloader_available() -> bool:
    """Whether ``torchdata.stateful_dataloader`` is installed."""
    return _installed("torchdata") and _installed("torchdata.stateful_dataloader")


def is_bnb_available(min_version: str | None = None) -> bool:
    """Whether bitsandbytes is installed (at version ``min_version`` or newer, when given)."""
    if not _installed("bitsandbytes"):
        return False
    if min_version is None:
        return True
    from importlib.metadata import version

    from torch.torch_version import TorchVersion

    return TorchVersion(version("bitsandbytes")) >= min_version


def is_8bit_bnb_available() -> bool:
    """Whether bitsandbytes (8-bit optimizers and layers) is installed."""
    return is_bnb_available()


def is_4bit_bnb_available() -> bool:
    """Whether bitsandbytes (4-bit layers) is installed."""
    return is_bnb_available()


def is_bitsandbytes_multi_backend_available() -> bool:
    """Whether bitsandbytes is installed (its backends are chosen at import)."""
    return is_bnb_available()


def is_tqdm_available() -> bool:
    """Whether tqdm is installed."""
    return _installed("tqdm")


def is_torch_distributed_available() -> bool:
    """Whether this torch build has ``torch.distributed``."""
    import torch.distributed

    return bool(torch.distributed.is_available())


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    """Whether numpy is installed at version ``min_version`` or newer."""
    if not _installed("numpy"):
        return False
    from importlib.metadata import version

    from torch.torch_version import TorchVersion

    return TorchVersion(version("numpy")) >= min_version


def is_transformer_engine_mxfp8_available() -> bool:
    """Whether Transformer Engine is installed and a GPU is present for MXFP8."""
    import torch

    return is_transformer_engine_available() and torch.cuda.is_available()


# ---------------------------------------------------------------------------------- devices
def is_cuda_available() -> bool:
    """Whether a CUDA (or ROCm) device is usable."""
    import torch

    return torch.cuda.is_available()


def is_rocm_available() -> bool:
    """Whether torch is a ROCm build with a usable device."""
    import torch

    return torch.version.hip is not None and torch.cuda.is_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    """Whether Apple's Metal (MPS) device is usable with torch >= ``min_version``."""
    import torch

    return is_torch_version(">=", min_version) and torch.backends.mps.is_available()


def is_xpu_available(check_device: bool = False) -> bool:
    """Whether an Intel XPU is usable (``check_device``: also that one can be addressed)."""
    import torch

    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return False
    return not check_device or xpu.device_count() > 0


def _plugin_device(module: str, attribute: str, check_device: bool) -> bool:
    import torch

    if not _installed(module):
        return False
    backend = getattr(torch, attribute, None)
    if backend is None:
        return False
    available = bool(backend.is_available())
    return available and (not check_device or backend.device_count() > 0)


def is_npu_available(check_device: bool = False) -> bool:
    """Whether an Ascend NPU is usable (needs ``torch_npu``)."""
    return _plugin_device("torch_npu", "npu", check_device)


def is_mlu_available(check_device: bool = False) -> bool:
    """Whether a Cambricon MLU is usable (needs ``torch_mlu``)."""
    return _plugin_device("torch_mlu", "mlu", check_device)


def is_musa_available(check_device: bool = False) -> bool:
    """Whether a Moore Threads MUSA device is usable (needs ``torch_musa``)."""
    return _plugin_device("torch_musa", "musa", check_device)


def is_sdaa_available(check_device: bool = False) -> bool:
    """Whether a Tecorigin SDAA device is usable (needs ``torch_sdaa``)."""
    return _plugin_device("torch_sdaa", "sdaa", check_device)


def is_hpu_available(init_hccl: bool = False) -> bool:
    """Whether an Intel Gaudi HPU is usable (needs ``habana_frameworks``)."""
    return _plugin_device("habana_frameworks", "hpu", False)


def is_habana_gaudi1() -> bool:
    """Whether the HPU is a first-generation Gaudi (never, without ``habana_frameworks``)."""
    if not is_hpu_available():
        return False
    import habana_frameworks.torch.utils.experimental as htexp  # type: ignore[import-not-found]

    return bool(htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi)


def is_neuron_available(check_device: bool = False) -> bool:
    """Whether AWS Neuron (``torch_neuronx``) is usable (``check_device``: a device is seen)."""
    if not _installed("torch_neuronx"):
        return False
    return not check_device or _plugin_device("torch_neuronx", "neuron", True)


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether torch_xla is installed (and, when asked, targets a TPU or a GPU via ``PJRT_DEVICE``).

    ``False`` when ``USE_TORCH_XLA=0`` was set before accel was imported.
    """
    if not USE_TORCH_XLA or not _installed("torch_xla"):
        return False
    device = os.environ.get("PJRT_DEVICE", "").upper()
    if check_is_tpu:
        return device == "TPU"
    if check_is_gpu:
        return device in ("GPU", "CUDA")
    return True


def is_xccl_available() -> bool:
    """Whether torch.distributed has the ``xccl`` backend (Intel GPUs)."""
    import torch

    dist = torch.distributed
    return bool(dist.is_available() and getattr(dist, "is_xccl_available", lambda: False)())


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Whether bfloat16 computation is supported on this process's device type."""
    import torch

    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    if is_cuda_available():
        return bool(torch.cuda.is_bf16_supported())
    if is_mps_available():
        return is_torch_version(">=", "2.6")
    return True


def is_fp16_available() -> bool:
    """Whether float16 mixed precision can run here (every device torch supports)."""
    return True


def is_fp8_available() -> bool:
    """Whether an fp8 backend library is installed (Transformer Engine, torchao or MS-AMP)."""
    return is_transformer_engine_available() or is_torchao_available() or is_msamp_available()


# ---------------------------------------------------------------------------------- others
def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch with ``version``, e.g. ``is_torch_version(">=", "2.1")``.

    Raises:
        ValueError: ``operation`` is not one of ``> >= == != <= <``.
    """
    import torch
    from torch.torch_version import TorchVersion

    compare = _COMPARISONS.get(operation)
    if compare is None:
        raise ValueError(
            f"is_torch_version(operation={operation!r}): use one of {', '.join(_COMPARISONS)}."
        )
    return compare(TorchVersion(torch.__version__), version)


def is_weights_only_available() -> bool:
    """Whether ``torch.load(weights_only=True)`` is supported (torch >= 2.4)."""
    return is_torch_version(">=", "2.4")


def is_compiled_module(module: Any) -> bool:
    """Whether ``module`` is the wrapper that ``torch.compile`` returns."""
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(module, OptimizedModule)


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on ``port`` of localhost (default: 29500, torchrun's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("localhost", port or 29500)) == 0


#: Whether torch_xla may be used at all (``USE_TORCH_XLA=0`` turns it off, as in Accelerate).
USE_TORCH_XLA = os.environ.get("USE_TORCH_XLA", "1").strip().lower() not in (
    "0",
    "false",
    "no",
    "off",
)


AVAILABILITY_CHECKS = sorted(
    name for name in dir() if name.startswith("is_") and name.endswith("_available")
)


# ---------------------------------------------------------------------------------- decorators
F = TypeVar("F", bound=Callable[..., Any])


def torchao_required(func: F) -> F:
    """Make ``func`` raise, naming the install, when torchao is not installed.

    Raises:
        UnsupportedFeatureError: (when called) torchao is missing.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_torchao_available():
            raise UnsupportedFeatureError(
                f"{func.__name__} needs torchao, which is not installed: "
                "pip install 'accel[fp8]' (or pip install torchao)."
            )
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
