"""Accelerate's ``accelerate.utils.constants``: file names and option tables.

The file-name stems are the ones accel-ckpt's ``save_state`` writes (``model``,
``pytorch_model``, ``optimizer``, ``scheduler``, ``scaler``, ``random_states``; the i-th object
after the first gets ``_<i>``). accel-ckpt differs in the suffixes: optimizer, scheduler, scaler,
RNG and dataloader state are ``.safetensors`` files (``.bin``/``.pt`` pickles only with
``allow_pickle``), RNG states are ``random_states_<rank>.safetensors`` and dataloader positions
``dataloader[_<i>].safetensors`` where Accelerate writes ``sampler[_<i>].bin``.

Example:
    >>> from accel.utils.constants import SAFE_WEIGHTS_PATTERN_NAME
    >>> SAFE_WEIGHTS_PATTERN_NAME.format(suffix="-00001-of-00002")
    'model-00001-of-00002.safetensors'
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from accel.profiling import PROFILE_PATTERN_NAME
from accel_ckpt.sharding import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

SCALER_NAME = "scaler.pt"
MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
RNG_STATE_NAME = "random_states"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
FSDP_MODEL_NAME = "pytorch_model_fsdp"

SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]

FSDP_SHARDING_STRATEGY = [
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
FSDP_PYTORCH_VERSION = "2.1.0"
FSDP2_PYTORCH_VERSION = "2.6.0"
DTENSOR_PYTORCH_VERSION = "2.5.0"
DEEPSPEED_MULTINODE_LAUNCHERS = [
    "pdsh",
    "standard",
    "openmpi",
    "mvapich",
    "mpich",
    "nossh",
    "slurm",
]
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = "2.2.0"
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = "0.18.2"

STR_OPERATION_TO_FUNC: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}

TORCH_LAUNCH_PARAMS = [
    "nnodes",
    "nproc_per_node",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "rdzv_conf",
    "standalone",
    "max_restarts",
    "monitor_interval",
    "start_method",
    "role",
    "module",
    "m",
    "no_python",
    "run_path",
    "log_dir",
    "r",
    "redirects",
    "t",
    "tee",
    "node_rank",
    "master_addr",
    "master_port",
]

CUDA_DISTRIBUTED_TYPES = ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
TORCH_DISTRIBUTED_OPERATION_TYPES = [
    *CUDA_DISTRIBUTED_TYPES,
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "MULTI_CPU",
    "MULTI_HPU",
    "MULTI_NEURON",
]
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING: tuple[type[torch.nn.Module], ...] = (
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
    torch.nn.ConvTranspose1d,
    torch.nn.ConvTranspose2d,
    torch.nn.ConvTranspose3d,
    torch.nn.Linear,
)

__all__ = [
    "BETA_CP_AVAILABLE_PYTORCH_VERSION",
    "BETA_SP_AVAILABLE_DEEPSPEED_VERSION",
    "BETA_TP_AVAILABLE_PYTORCH_VERSION",
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
    "CUDA_DISTRIBUTED_TYPES",
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DTENSOR_PYTORCH_VERSION",
    "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION",
    "FSDP2_PYTORCH_VERSION",
    "FSDP2_STATE_DICT_TYPE",
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_MODEL_NAME",
    "FSDP_PYTORCH_VERSION",
    "FSDP_SHARDING_STRATEGY",
    "FSDP_STATE_DICT_TYPE",
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "PROFILE_PATTERN_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "SAGEMAKER_PARALLEL_EC2_INSTANCES",
    "SAGEMAKER_PYTHON_VERSION",
    "SAGEMAKER_PYTORCH_VERSION",
    "SAGEMAKER_TRANSFORMERS_VERSION",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "STR_OPERATION_TO_FUNC",
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "TORCH_DISTRIBUTED_OPERATION_TYPES",
    "TORCH_DYNAMO_MODES",
    "TORCH_LAUNCH_PARAMS",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME",
]
