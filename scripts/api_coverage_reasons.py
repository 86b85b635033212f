"""Why a public name of Accelerate is absent from accel or differs there (see api_coverage.py).

Every reason the coverage report prints lives here:

* :data:`NOTES`: one name of one Accelerate module (or of ``Accelerator``), absent or deliberately
  different. A note keyed by ``accelerate.utils`` also covers the same object under its other
  module paths (``accelerate.utils.dataclasses.X``), and the other way round.
* :data:`ABSENT_PATTERNS`: absent names matched by module and name patterns.
* :data:`SUBMODULE_REASONS`: module paths of Accelerate that accel does not provide.
* :data:`REACHED_IMPORTS` and :data:`PRIVATE_NAMES`: which imported and private names of a
  module count as its API (definitions count always).
"""

from __future__ import annotations

_ND = (
    "internal to Accelerate's N-D parallelism (ParallelismConfig, TP/CP on a device mesh is in "
    "accel: accel_state.parallelism_config, accel/strategies/mesh/strategy.py) or its Ulysses sequence "
    "parallelism, which accel refuses (DeepSpeed's ALST needs transformers models)"
)
_FSDP = (
    "an internal FSDP helper of Accelerate; accel's FSDP strategy does this inside prepare, "
    "save_state/load_state and `accel merge-weights` (accel/strategies/fsdp/strategy.py)"
)
_DEEPSPEED = (
    "an internal DeepSpeed helper of Accelerate (or Ulysses sequence parallelism, not a target); "
    "accel's DeepSpeed strategy drives the engine itself (accel/strategies/deepspeed/strategy.py)"
)
_BIG_MODEL = (
    "a lower-level big-model helper of Accelerate that accel's big-model API "
    "(accel_ckpt.big_modeling) uses internally or does not need"
)
_MEGATRON = (
    "present so imports work; using it raises UnsupportedFeatureError: Megatron-LM is not a "
    "target of accel (use FSDP2, DeepSpeed or a ParallelismConfig)"
)

# Reasons for names that are absent or differ, keyed by (namespace, name). A name listed here as
# "differs" is reported so even when the automatic comparison finds nothing missing.
NOTES: dict[tuple[str, str], tuple[str, str]] = {
    ("accelerate", "ParallelismConfig"): (
        "differs",
        "one degree may be -1 (the leftover processes); CPU/gloo jobs are accepted; sp_size > 1 "
        "is refused (ALST needs transformers models); a config of ones under FSDP takes every "
        "process on dp_shard",
    ),
    ("Accelerator", "prepare"): (
        "differs",
        "with a ParallelismConfig a plain torch model is split by a tp plan (TorchTensorParallel"
        "Config(plan=) or the model's tp_plan) and dp_shard_size > 1 shards with FSDP2 even "
        "without FSDP settings",
    ),
    ("Accelerator", "deepspeed_ulysses_dl_adapter"): ("absent", _DEEPSPEED),
    ("Accelerator", "lomo_backward"): ("absent", "the LOMO optimizer is not a target of accel"),
    ("accelerate.utils", "filter_first_and_last_linear_layers"): (
        "differs",
        "skips the first and last linear layers of the model being converted; Accelerate's, "
        "given each layer, looks for them inside that layer and so skips none",
    ),
    ("accelerate.utils", "AORecipeKwargs"): (
        "differs",
        "config is built at prepare (no torchao import when the recipe is made); "
        "enable_fsdp_float8_all_gather acts under FSDP2 only and is turned off elsewhere",
    ),
    ("accelerate.utils", "FP8RecipeKwargs"): (
        "differs",
        "also accepts backend='AO' (torchao); no deprecation warning",
    ),
    ("accelerate.utils", "load_and_quantize_model"): (
        "differs",
        "runs on the CPU too, and offloads 4-bit layers (quantized) where Accelerate refuses; "
        "reads safetensors checkpoints only",
    ),
    ("accelerate.utils.bnb", "quantize_and_offload_8bit"): (
        "absent",
        "an inner step of Accelerate's load_checkpoint_in_model for 8-bit layers planned on "
        "disk (quantize on GPU 0, write int8 weight and SCB into Accelerate's offload index); "
        "accel's load_and_quantize_model quantizes and offloads such layers itself "
        "(QuantizedOffloadHook, its own offload format), so the step has no meaning on its own",
    ),
    ("Accelerator", "clip_grad_norm_"): (
        "differs",
        "under fp16 an accumulation micro-step clips the still-scaled gradient instead of "
        "unscaling a partial gradient",
    ),
    ("Accelerator", "clip_grad_value_"): ("differs", "as clip_grad_norm_ under fp16"),
    ("Accelerator", "unwrap_model"): (
        "differs",
        "a compiled DDP model unwraps to a new compiled wrapper; the prepared one keeps DDP",
    ),
    ("accelerate.utils", "prepare_sagemager_args_inputs"): (
        "differs",
        "raises LaunchArgumentError: Amazon SageMaker is a service accel does not target",
    ),
    ("accelerate.utils", "prepare_tpu"): (
        "differs",
        "pod=True (TPU pods over gcloud) raises LaunchArgumentError; run `accel launch --tpu` on "
        "each TPU VM",
    ),
    ("accelerate.utils", "prepare_deepspeed_cmd_env"): (
        "differs",
        "the command is `accel launch --use_deepspeed ...` (torch elastic, the 'standard' "
        "multi-node launcher), not the deepspeed/pdsh runner",
    ),
    ("accelerate.utils", "set_numa_affinity"): (
        "differs",
        "also acts on CPU runs: local processes split their NUMA node's cores into equal blocks "
        "(Accelerate: GPU runs only); a no-op where the kernel publishes no NUMA information",
    ),
    ("accelerate.utils", "PrepareForLaunch"): (
        "differs",
        "also gives FSDP and DEEPSPEED processes their RANK/LOCAL_RANK (Accelerate: MULTI_* only)",
    ),
    ("accelerate.utils", "TorchDynamoPlugin"): (
        "differs",
        "backend defaults to 'no' and fullgraph to False instead of None (read from the launcher)",
    ),
    ("accelerate.utils", "purge_accelerate_environment"): (
        "absent",
        "test decorator for ACCELERATE_* variables; use accel_state.testing.without_launcher_variables",
    ),
    ("accelerate.utils", "get_current_device_type"): (
        "differs",
        "a machine without an accelerator gives ('cpu', 'MULTI_CPU') where Accelerate answers "
        "('cuda', 'MULTI_GPU')",
    ),
    ("accelerate.utils", "get_grad_scaler"): (
        "differs",
        "the scaler is for this machine's device (CPU included) where Accelerate defaults to CUDA",
    ),
    ("accelerate.utils", "get_fsdp2_grad_scaler"): ("differs", "as get_grad_scaler"),
    ("accelerate.utils", "install_xla"): (
        "differs",
        "refuses with UnsupportedFeatureError naming the pip command (Accelerate's fetched a "
        "Colab wheel for Python 3.7 that no longer exists)",
    ),
    ("accelerate.utils", "MODEL_NAME"): (
        "differs",
        "the constants have Accelerate's values and accel-ckpt uses the same stems (model, "
        "pytorch_model, optimizer, scheduler, random_states); accel-ckpt writes optimizer, "
        "scheduler, scaler and RNG state as .safetensors (random_states_<rank>), and dataloader "
        "positions as dataloader[_<i>].safetensors where Accelerate writes sampler[_<i>].bin",
    ),
    ("accelerate.utils", "save_fsdp_model"): (
        "differs",
        "use_dcp=True only (use_dcp=False, per-rank .bin shards, raises); the sharded layout is a "
        "torch.distributed.checkpoint folder",
    ),
    ("accelerate.utils", "load_fsdp_model"): ("differs", "as save_fsdp_model: use_dcp=True only"),
    ("accelerate.utils", "save_fsdp_optimizer"): (
        "differs",
        "use_dcp is accepted; the sharded layout is always written with torch.distributed.checkpoint",
    ),
    ("accelerate.utils", "ensure_weights_retied"): (
        "differs",
        "reties every group of tied parameters after each module's param_init_fn (device unused)",
    ),
    **{
        ("accelerate.data_loader", name): (
            "differs",
            "no torch_device_mesh parameter: accel's loaders take the N-D mesh from the job "
            "(PartialState().data_parallel_size / data_parallel_process_index, set by the "
            "ParallelismConfig's mesh), so tensor/context-parallel ranks share a batch without it",
        )
        for name in ("DataLoaderShard", "DataLoaderDispatcher", "prepare_data_loader")
    },
    ("accelerate.data_loader", "DataLoaderAdapter"): (
        "absent",
        "Accelerate's delegating wrapper that swaps in torchdata's StatefulDataLoader; accel's "
        "DataLoaderShard/DataLoaderDispatcher are DataLoader subclasses whose state_dict/"
        "load_state_dict (DataLoaderStateMixin) resume mid-epoch with or without torchdata "
        "(with use_stateful_dataloader=True they are torchdata StatefulDataLoader instances too)",
    ),
    ("accelerate.state", "AcceleratorState"): (
        "differs",
        "_from_accelerator is accepted and unused: an AcceleratorState may be created without an "
        "Accelerator (Accelerate raises ValueError); megatron_lm_plugin other than None raises "
        "UnsupportedFeatureError",
    ),
    **{
        ("accelerate.utils", name): ("differs", _MEGATRON)
        for name in (
            "AbstractTrainStep",
            "BertTrainStep",
            "GPTTrainStep",
            "T5TrainStep",
            "MegatronLMDummyDataLoader",
            "MegatronLMDummyScheduler",
            "MegatronLMPlugin",
            "add_model_config_to_megatron_parser",
            "avg_losses_across_data_parallel_group",
        )
    },
}

# The documented namespaces; the broad patterns below apply to them only (a name matched there
# carries its reason to the same object under its other module paths).
_DOCUMENTED = r"accelerate(\.utils)?"

# Absent names matched by pattern: (module regex, name regex, reason); first match wins.
ABSENT_PATTERNS: list[tuple[str, str, str]] = [
    (
        _DOCUMENTED,
        r"(?i).*(megatron|TrainStep).*|avg_losses_across_data_parallel_group",
        "Megatron-LM is not a target of accel",
    ),
    (_DOCUMENTED, r"(?i).*deepspeed.*|GatheredParameters", _DEEPSPEED),
    (_DOCUMENTED, r"(?i).*fsdp.*|FullyShardedDataParallelPlugin", _FSDP),
    (
        _DOCUMENTED,
        r"get_model_tp_size|model_has_dtensor|AccelerateSequenceParallelConfig"
        r"|SequenceShardingDataLoader|.*[Uu]lysses.*",
        _ND,
    ),
    (
        r"accelerate",
        r"big_modeling|hooks|cpu_offload.*|disk_offload|dispatch_model"
        r"|infer_auto_device_map|init_empty_weights|init_on_device|load_checkpoint_and_dispatch",
        _BIG_MODEL,
    ),
    (
        r"accelerate\.utils",
        r"OffloadedWeightsLoader|PrefixedDataset|CustomDtype|align_module_device"
        r"|calculate_maximum_sizes|check_device_map|check_tied_parameters_.*|compute_module_sizes"
        r"|dtype_byte_size|extract_submodules_state_dict|find_tied_parameters|get_balanced_memory"
        r"|get_max_layer_size|get_max_memory|has_offloaded_params|infer_auto_device_map"
        r"|load_offloaded_weights?|load_state_dict|named_module_tensors|offload_state_dict"
        r"|offload_weight|retie_parameters|save_offload_index|set_module_tensor_to_device"
        r"|get_module_children_bottom_up|ensure_weights_retied|convert_file_size_to_int",
        _BIG_MODEL,
    ),
    (
        r"accelerate\.utils\.megatron_lm",
        r".*",
        "Megatron-LM's engine, optimizer and scheduler wrappers; Megatron-LM is not a target of "
        "accel",
    ),
    (
        r"accelerate\.utils\.dataclasses",
        r"parse_\w+_config|MODEL_CONFIGS_TO_MEGATRON_PARSERS",
        "MegatronLMPlugin's per-model config parsers; Megatron-LM is not a target of accel",
    ),
    (
        r"accelerate\.utils\.fsdp_utils",
        r"fsdp2_prepare_auto_wrap_policy",
        _FSDP,
    ),
    (
        r"accelerate\..*",
        r"logger",
        "the module's own logging.Logger; accel's modules log under their own names",
    ),
    (
        r"accelerate\.test_utils\.scripts\..*",
        r"(?!main$).*",
        "a helper inside one of Accelerate's test programs; accel's program of the same path "
        "runs the same checks with helpers of its own (only `main` is its interface)",
    ),
]

# Module paths of Accelerate that may have no accel twin: (regex over Accelerate's dotted path,
# reason), used while accel has no module there (one it has is compared like any other). Every
# other path must import as ``accel.<same path>``.
SUBMODULE_REASONS: list[tuple[str, str]] = [
    (
        r"accelerate\.test_utils\.scripts(\..+)?",
        "Accelerate's own test programs; `nox -s peer` runs them unchanged against accel after "
        "the rename",
    ),
]


# Names a module imports (rather than defines) count as its API only where they are listed here,
# except in packages (``__init__``), which are re-export modules: all their imports count. The
# list is every such name that Accelerate 1.15's tests and test programs, transformers 5.24,
# datasets 5.2 or evaluate 0.4.6 import from that module path or patch there (mock.patch).
REACHED_IMPORTS: dict[str, tuple[str, ...]] = {
    "accelerate.accelerator": (
        "DataLoaderConfiguration",
        "GradientAccumulationPlugin",
        "is_bitsandbytes_multi_backend_available",
        "is_xpu_available",
    ),
    "accelerate.big_modeling": ("check_device_map",),
    "accelerate.commands.config.config_args": ("default_config_file",),
    "accelerate.commands.env": ("which",),
    "accelerate.state": ("get_int_from_env",),
    "accelerate.test_utils.testing": ("is_hpu_available", "is_xpu_available"),
    "accelerate.utils.launch": ("subprocess", "which"),
}

# Private names that Accelerate's tests use, per module; ``Class.attribute`` for class members.
PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    "accelerate.big_modeling": ("_refuse_recurrent_layers_under_sequence_parallelism",),
    "accelerate.commands.launch": ("_validate_launch_command",),
    "accelerate.parallelism_config": ("ParallelismConfig._get_mesh",),
    "accelerate.state": (
        "PartialState._shared_state",
        "PartialState._reset_state",
        "AcceleratorState._shared_state",
        "AcceleratorState._reset_state",
        "GradientState._shared_state",
        "GradientState._reset_state",
    ),
    "accelerate.utils": ("_filter_args",),
    "accelerate.utils.launch": ("_convert_nargs_to_dict", "_filter_args"),
}
