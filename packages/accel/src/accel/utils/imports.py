"""Accelerate's ``accelerate.utils.imports`` module path: a door to :mod:`accel.availability`."""

from __future__ import annotations

from accel.accelerator_state import (
    deepspeed_required as deepspeed_required,
)
from accel.availability import (
    AVAILABILITY_CHECKS as AVAILABILITY_CHECKS,
)
from accel.availability import (
    USE_TORCH_XLA as USE_TORCH_XLA,
)
from accel.availability import (
    F as F,
)
from accel.availability import (
    is_4bit_bnb_available as is_4bit_bnb_available,
)
from accel.availability import (
    is_8bit_bnb_available as is_8bit_bnb_available,
)
from accel.availability import (
    is_aim_available as is_aim_available,
)
from accel.availability import (
    is_amdsmi_available as is_amdsmi_available,
)
from accel.availability import (
    is_bf16_available as is_bf16_available,
)
from accel.availability import (
    is_bitsandbytes_multi_backend_available as is_bitsandbytes_multi_backend_available,
)
from accel.availability import (
    is_bnb_available as is_bnb_available,
)
from accel.availability import (
    is_boto3_available as is_boto3_available,
)
from accel.availability import (
    is_clearml_available as is_clearml_available,
)
from accel.availability import (
    is_comet_ml_available as is_comet_ml_available,
)
from accel.availability import (
    is_compiled_module as is_compiled_module,
)
from accel.availability import (
    is_cuda_available as is_cuda_available,
)
from accel.availability import (
    is_datasets_available as is_datasets_available,
)
from accel.availability import (
    is_deepspeed_available as is_deepspeed_available,
)
from accel.availability import (
    is_dvclive_available as is_dvclive_available,
)
from accel.availability import (
    is_fp8_available as is_fp8_available,
)
from accel.availability import (
    is_fp16_available as is_fp16_available,
)
from accel.availability import (
    is_habana_gaudi1 as is_habana_gaudi1,
)
from accel.availability import (
    is_hpu_available as is_hpu_available,
)
from accel.availability import (
    is_import_timer_available as is_import_timer_available,
)
from accel.availability import (
    is_lomo_available as is_lomo_available,
)
from accel.availability import (
    is_matplotlib_available as is_matplotlib_available,
)
from accel.availability import (
    is_megatron_lm_available as is_megatron_lm_available,
)
from accel.availability import (
    is_mlflow_available as is_mlflow_available,
)
from accel.availability import (
    is_mlu_available as is_mlu_available,
)
from accel.availability import (
    is_mps_available as is_mps_available,
)
from accel.availability import (
    is_msamp_available as is_msamp_available,
)
from accel.availability import (
    is_musa_available as is_musa_available,
)
from accel.availability import (
    is_neuron_available as is_neuron_available,
)
from accel.availability import (
    is_npu_available as is_npu_available,
)
from accel.availability import (
    is_numpy_available as is_numpy_available,
)
from accel.availability import (
    is_pandas_available as is_pandas_available,
)
from accel.availability import (
    is_peft_available as is_peft_available,
)
from accel.availability import (
    is_pippy_available as is_pippy_available,
)
from accel.availability import (
    is_port_in_use as is_port_in_use,
)
from accel.availability import (
    is_pynvml_available as is_pynvml_available,
)
from accel.availability import (
    is_pytest_available as is_pytest_available,
)
from accel.availability import (
    is_rich_available as is_rich_available,
)
from accel.availability import (
    is_rocm_available as is_rocm_available,
)
from accel.availability import (
    is_sagemaker_available as is_sagemaker_available,
)
from accel.availability import (
    is_schedulefree_available as is_schedulefree_available,
)
from accel.availability import (
    is_sdaa_available as is_sdaa_available,
)
from accel.availability import (
    is_swanlab_available as is_swanlab_available,
)
from accel.availability import (
    is_tensorboard_available as is_tensorboard_available,
)
from accel.availability import (
    is_timm_available as is_timm_available,
)
from accel.availability import (
    is_torch_distributed_available as is_torch_distributed_available,
)
from accel.availability import (
    is_torch_version as is_torch_version,
)
from accel.availability import (
    is_torch_xla_available as is_torch_xla_available,
)
from accel.availability import (
    is_torchao_available as is_torchao_available,
)
from accel.availability import (
    is_torchdata_available as is_torchdata_available,
)
from accel.availability import (
    is_torchdata_stateful_dataloader_available as is_torchdata_stateful_dataloader_available,
)
from accel.availability import (
    is_torchvision_available as is_torchvision_available,
)
from accel.availability import (
    is_tqdm_available as is_tqdm_available,
)
from accel.availability import (
    is_trackio_available as is_trackio_available,
)
from accel.availability import (
    is_transformer_engine_available as is_transformer_engine_available,
)
from accel.availability import (
    is_transformer_engine_mxfp8_available as is_transformer_engine_mxfp8_available,
)
from accel.availability import (
    is_transformers_available as is_transformers_available,
)
from accel.availability import (
    is_triton_available as is_triton_available,
)
from accel.availability import (
    is_wandb_available as is_wandb_available,
)
from accel.availability import (
    is_weights_only_available as is_weights_only_available,
)
from accel.availability import (
    is_xccl_available as is_xccl_available,
)
from accel.availability import (
    is_xpu_available as is_xpu_available,
)
from accel.availability import (
    torchao_required as torchao_required,
)
from accel.errors import (
    AcceleratorConfigError as AcceleratorConfigError,
)
from accel.errors import (
    UnsupportedFeatureError as UnsupportedFeatureError,
)
from accel.patch_forwarding import serve_as_door

serve_as_door(__name__, "accel.availability")
