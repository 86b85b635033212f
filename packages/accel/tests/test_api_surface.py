"""Issue 14: Accelerate's module paths, helpers, state handling and Accelerator methods."""

import importlib
import inspect
import json
import os
import pickle
import sys

import pytest
import surface_workers
import torch

import accel
import accel.utils
from accel import (
    Accelerator,
    AcceleratorConfigError,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    ProfileKwargs,
    TorchDynamoPlugin,
    UnsupportedFeatureError,
)
from accel.compilation import compile_model
from accel.local_sgd import LocalSGD
from accel.state import AcceleratorState, PartialState
from accel.utils import DynamoBackend
from accel_state import DistributedType, LaunchContract, reset_state
from accel_state.testing import spawn_workers
from accel_state.torch_compat import local_dcp_options

MODULE_NAMES = {
    "accel.data_loader": [
        "prepare_data_loader",
        "skip_first_batches",
        "DataLoaderShard",
        "DataLoaderDispatcher",
        "SeedableRandomSampler",
        "BatchSamplerShard",
        "IterableDatasetShard",
        "SkipBatchSampler",
        "SkipDataLoader",
        "DataLoaderStateMixin",
        "get_sampler",
    ],
    "accel.state": ["AcceleratorState", "PartialState", "GradientState", "is_initialized"],
    "accel.utils.operations": [
        "DistributedOperationException",
        "gather",
        "gather_object",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "pad_across_processes",
        "send_to_device",
        "recursively_apply",
        "find_batch_size",
        "concatenate",
        "copy_tensor_to_devices",
    ],
    "accel.optimizer": ["AcceleratedOptimizer", "move_to_device"],
    "accel.scheduler": ["AcceleratedScheduler"],
    "accel.logging": ["get_logger", "MultiProcessAdapter"],
    "accel.launchers": ["notebook_launcher", "debug_launcher"],
    "accel.local_sgd": ["LocalSGD"],
    "accel.test_utils": [
        "RegressionDataset",
        "RegressionModel",
        "require_cuda",
        "require_multi_gpu",
        "require_cpu",
        "slow",
        "get_launch_command",
        "execute_subprocess_async",
        "are_the_same_tensors",
        "assert_exception",
        "capture_call_output",
        "device_count",
        "torch_device",
    ],
    "accel.test_utils.testing": ["require_non_cpu", "require_torch_min_version"],
    "accel.test_utils.training": ["RegressionDataset", "RegressionModel"],
    "accel.utils": [
        "is_bf16_available",
        "is_fp16_available",
        "is_mps_available",
        "is_xpu_available",
        "is_cuda_available",
        "is_npu_available",
        "is_mlu_available",
        "is_musa_available",
        "is_hpu_available",
        "is_torch_xla_available",
        "is_deepspeed_available",
        "is_tensorboard_available",
        "is_wandb_available",
        "is_mlflow_available",
        "is_comet_ml_available",
        "is_transformers_available",
        "is_rich_available",
        "is_torch_version",
        "DynamoBackend",
        "DDPCommunicationHookType",
        "ProfileKwargs",
        "DistributedOperationException",
    ],
    "accel": ["DDPCommunicationHookType", "ProfileKwargs", "find_executable_batch_size"],
    "accel.utils.dataclasses": [
        "DistributedDataParallelKwargs",
        "DDPCommunicationHookType",
        "DynamoBackend",
        "ProfileKwargs",
        "TorchDynamoPlugin",
        "DistributedType",
    ],
    "accel.utils.random": ["set_seed", "synchronize_rng_states"],
    "accel.utils.environment": ["parse_flag_from_env", "patch_environment", "str_to_bool"],
    "accel.utils.imports": ["is_bf16_available", "is_torch_xla_available"],
}

#: Every keyword of Accelerate 1.x's ``Accelerator.__init__``.
ACCELERATE_KEYWORDS = [
    "device_placement",
    "split_batches",
    "mixed_precision",
    "gradient_accumulation_steps",
    "cpu",
    "dataloader_config",
    "deepspeed_plugin",
    "fsdp_plugin",
    "torch_tp_plugin",
    "megatron_lm_plugin",
    "rng_types",
    "log_with",
    "project_dir",
    "project_config",
    "gradient_accumulation_plugin",
    "step_scheduler_with_optimizer",
    "kwargs_handlers",
    "dynamo_backend",
    "dynamo_plugin",
    "deepspeed_plugins",
    "parallelism_config",
    "even_batches",
    "dispatch_batches",
    "use_seedable_sampler",  # Accelerate 0.x
    "logging_dir",  # Accelerate 0.x
]


# ---------------------------------------------------------------- module paths and names
@pytest.mark.parametrize("module_name", sorted(MODULE_NAMES))
def test_accelerate_module_paths_import_with_their_names(module_name):
    module = importlib.import_module(module_name)
    missing = [name for name in MODULE_NAMES[module_name] if not hasattr(module, name)]
    assert not missing, f"{module_name} lacks {missing}"


def test_utils_operations_error_is_what_debug_mode_raises():
    from accel.utils.operations import DistributedOperationException
    from accel_ops import DistributedOperationError

    assert issubclass(DistributedOperationError, DistributedOperationException)


def test_availability_helpers_answer_booleans_and_agree_with_torch():
    from accel.utils import imports

    for name in imports.AVAILABILITY_CHECKS:
        assert isinstance(getattr(accel.utils, name)(), bool), name
    assert accel.utils.is_cuda_available() == torch.cuda.is_available()
    assert accel.utils.is_torch_version(">=", "2.0") and not accel.utils.is_torch_version("<", "1")
    assert accel.utils.is_pytest_available() and not accel.utils.is_megatron_lm_available()
    with pytest.raises(ValueError, match="operation='=>'"):
        accel.utils.is_torch_version("=>", "2.0")


def test_utils_import_stays_torch_free_until_a_device_check_runs():
    code = "import sys, accel.utils; print('torch' in sys.modules)"
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "False"


def test_distributed_type_has_accelerates_members_with_its_values():
    expected = [
        "NO",
        "MULTI_CPU",
        "MULTI_GPU",
        "MULTI_NPU",
        "MULTI_MLU",
        "MULTI_SDAA",
        "MULTI_MUSA",
        "MULTI_XPU",
        "DEEPSPEED",
        "FSDP",
        "XLA",
        "MEGATRON_LM",
        "MULTI_HPU",
        "MULTI_NEURON",
    ]
    assert [member.name for member in DistributedType] == expected
    assert all(DistributedType[name].value == name for name in expected)
    assert DistributedType("multi_npu") is DistributedType.MULTI_NPU
    assert DistributedType.TPU is DistributedType.XLA


# ---------------------------------------------------------------- debug mode and state
def test_accelerate_debug_variable_is_honoured_beside_accels(monkeypatch):
    monkeypatch.delenv("ACCEL_DEBUG_MODE", raising=False)
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "1")
    assert LaunchContract.from_env().debug
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "0")
    assert not LaunchContract.from_env().debug


def test_partial_state_debug_is_settable_and_drives_the_collective_checks():
    import accel_ops

    state = PartialState(cpu=True)
    assert state.debug is False and not accel_ops.is_debug_mode()
    state.debug = True
    assert PartialState().debug and accel_ops.is_debug_mode()
    state.debug = False
    assert not accel_ops.is_debug_mode()


def test_reset_keeps_the_partial_state_and_explains_itself_when_preparing():
    accelerator = Accelerator(cpu=True)
    AcceleratorState._reset_state()
    assert PartialState().initialized
    assert not importlib.import_module("accel.state").is_initialized()
    with pytest.raises(AcceleratorConfigError, match=r"_reset_state\(\).*new Accelerator"):
        accelerator.prepare(torch.nn.Linear(1, 1))
    assert Accelerator(cpu=True).prepare(torch.nn.Linear(1, 1)) is not None
    AcceleratorState._reset_state(reset_partial_state=True)
    assert not PartialState._shared_state


def test_an_accelerator_survives_pickling_with_an_equal_state():
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2))
    restored = pickle.loads(pickle.dumps(accelerator))
    assert restored.state == accelerator.state
    assert restored.device == accelerator.device and restored.num_processes == 1
    assert restored.prepare(torch.nn.Linear(1, 1)) is not None


# ---------------------------------------------------------------- Accelerator keywords
def test_accelerator_accepts_every_accelerate_keyword(tmp_path):
    parameters = inspect.signature(Accelerator.__init__).parameters
    assert [name for name in ACCELERATE_KEYWORDS if name not in parameters] == []
    old_style = Accelerator(cpu=True, logging_dir=str(tmp_path), use_seedable_sampler=True)
    assert old_style.project_dir == str(tmp_path) and old_style.use_seedable_sampler


def test_unsupported_keywords_raise_a_clear_error():
    with pytest.raises(UnsupportedFeatureError, match=r"megatron_lm_plugin=.*not"):
        Accelerator(cpu=True, megatron_lm_plugin=object())


@pytest.mark.parametrize(
    ("keyword", "kind"),
    [("torch_tp_plugin", "TorchTensorParallelPlugin"), ("parallelism_config", "ParallelismConfig")],
)
def test_n_d_keywords_check_their_type(keyword, kind):
    with pytest.raises(AcceleratorConfigError, match=rf"{keyword}=.*accel\.{kind}"):
        Accelerator(cpu=True, **{keyword: object()})


def test_dynamo_plugin_keyword_and_backend_enum():
    plugin = TorchDynamoPlugin(backend=DynamoBackend.EAGER, disable=True, options={"a": 1})
    accelerator = Accelerator(cpu=True, dynamo_plugin=plugin)
    assert accelerator.state.dynamo_plugin.backend == "eager"
    model = torch.nn.Linear(2, 2)
    assert accelerator.prepare(model) is model  # disable=True keeps it eager
    with pytest.raises(AcceleratorConfigError, match="dynamo_backend='eager'"):
        Accelerator(cpu=True, dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin())
    assert [m.name for m in DynamoBackend][:4] == ["NO", "EAGER", "AOT_EAGER", "INDUCTOR"]


def test_dynamo_plugin_reads_the_launchers_variables(monkeypatch):
    # Regression: TorchDynamoPlugin() ignored ACCELERATE_DYNAMO_* (what `accelerate launch` sets).
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "AOT_EAGER")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "true")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "true")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "true")
    plugin = TorchDynamoPlugin()
    assert (plugin.backend, plugin.mode) == ("aot_eager", "reduce-overhead")
    assert plugin.fullgraph and plugin.dynamic and plugin.use_regional_compilation
    explicit = TorchDynamoPlugin(backend="eager", fullgraph=False, use_regional_compilation=False)
    assert explicit.backend == "eager" and not explicit.fullgraph
    assert not explicit.use_regional_compilation
    # to_kwargs shows the launcher's settings, measured against the defaults of no launcher.
    assert TorchDynamoPlugin().to_kwargs() == {
        "backend": "aot_eager",
        "mode": "reduce-overhead",
        "fullgraph": True,
        "dynamic": True,
        "use_regional_compilation": True,
    }
    monkeypatch.setenv("ACCEL_DYNAMO_BACKEND", "inductor")  # accel's own variable wins
    assert TorchDynamoPlugin().backend == "inductor"
    for name in [n for n in os.environ if n.startswith(("ACCEL_DYNAMO", "ACCELERATE_DYNAMO"))]:
        monkeypatch.delenv(name)
    assert TorchDynamoPlugin().to_kwargs() == {}


def test_accelerate_torch_device_picks_the_device(monkeypatch):
    # Regression: Accelerator().device ignored ACCELERATE_TORCH_DEVICE.
    reset_state()
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu:3")
    try:
        assert Accelerator().device == torch.device("cpu", 3)
    finally:
        reset_state()


def test_regional_compilation_compiles_the_repeated_blocks_only():
    model = torch.nn.Sequential(
        torch.nn.ModuleList([torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)]), torch.nn.Linear(3, 1)
    )
    plugin = TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    assert compile_model(model, plugin) is model
    blocks = list(model[0])
    assert all(block._compiled_call_impl is not None for block in blocks)
    assert model[1]._compiled_call_impl is None
    out = blocks[1](blocks[0](torch.ones(1, 3)))
    assert out.shape == (1, 3)


def test_compile_regions_returns_a_twin_and_leaves_the_model_alone():
    # Regression: compile_regions compiled the caller's module in place; Accelerate returns a
    # new module (sharing parameters) and leaves the original uncompiled.
    from accel.utils import compile_regions, extract_model_from_parallel, has_compiled_regions

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)])
            self.head = torch.nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    model = Net()
    twin = compile_regions(model, backend="eager")
    assert twin is not model and twin._orig_mod is model
    assert not has_compiled_regions(model) and has_compiled_regions(twin)
    assert all(block._compiled_call_impl is None for block in model.blocks)
    assert twin.blocks[0]._orig_mod is model.blocks[0] and twin.head._orig_mod is model.head
    assert twin.head.weight is model.head.weight  # parameters are shared
    assert torch.equal(twin(torch.ones(2, 3)), model(torch.ones(2, 3)))
    assert extract_model_from_parallel(twin, keep_torch_compile=False) is model
    assert extract_model_from_parallel(twin) is twin


def test_ddp_comm_hook_settings_are_validated():
    assert (
        DistributedDataParallelKwargs(comm_hook="bf16").comm_hook is DDPCommunicationHookType.BF16
    )
    with pytest.raises(AcceleratorConfigError, match="comm_hook='nope'"):
        DistributedDataParallelKwargs(comm_hook="nope")
    with pytest.raises(AcceleratorConfigError, match=r"comm_wrapper='fp16'.*power_sgd"):
        DistributedDataParallelKwargs(comm_hook="fp16", comm_wrapper="fp16")
    with pytest.raises(AcceleratorConfigError, match="comm_state_option"):
        DistributedDataParallelKwargs(comm_state_option={"matrix_approximation_rank": 2})
    settings = DistributedDataParallelKwargs(static_graph=True, comm_hook="fp16")
    assert settings.ddp_kwargs() == {"static_graph": True}


# ---------------------------------------------------------------- profile, LocalSGD, test_utils
def test_power_sgd_without_numpy_is_a_clear_error(monkeypatch):
    from accel.kwargs_handlers import DDPCommunicationHookType
    from accel.strategies.ddp.comm_hooks import require_numpy_for

    require_numpy_for(DDPCommunicationHookType.POWER_SGD)  # numpy is installed here
    monkeypatch.setitem(sys.modules, "numpy", None)  # as on a plain install: not importable
    with pytest.raises(AcceleratorConfigError, match=r"comm_hook='power_sgd'.*pip install numpy"):
        require_numpy_for(DDPCommunicationHookType.POWER_SGD)


def test_profile_runs_the_schedule_and_calls_on_trace_ready():
    ready = []
    handler = ProfileKwargs(
        activities=["cpu"],
        schedule_option={"wait": 0, "warmup": 1, "active": 1, "repeat": 1},
        on_trace_ready=ready.append,
    )
    accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
    with accelerator.profile() as profiler:
        for _ in range(3):
            torch.ones(4, 4).sum()
            profiler.step()
    assert len(ready) == 1
    with pytest.raises(AcceleratorConfigError, match="activities"):
        ProfileKwargs(activities=["gpu"]).build()


def test_local_sgd_refuses_bad_steps_and_is_a_no_op_on_one_process():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    with pytest.raises(AcceleratorConfigError, match="local_sgd_steps=0"):
        LocalSGD(accelerator, model, local_sgd_steps=0)
    with LocalSGD(accelerator, model, local_sgd_steps=1) as local_sgd:
        local_sgd.step()
    assert local_sgd.num_steps == 1 and not local_sgd.enabled


def test_test_utils_helpers_work():
    from accel.test_utils import (
        RegressionDataset,
        RegressionModel,
        assert_exception,
        capture_call_output,
        execute_subprocess_async,
        get_launch_command,
    )

    data = RegressionDataset(a=2, b=3, length=8, seed=0)
    assert len(data) == 8 and abs(float(data[0]["y"]) - (2 * data[0]["x"] + 3)) < 0.5
    assert RegressionModel(a=1, b=2)(torch.tensor([1.0])).item() == 3.0
    assert get_launch_command(num_processes=2, cpu=True, debug=False)[-2:] == [
        "--num_processes=2",
        "--cpu",
    ]
    with assert_exception(ValueError, "bad"):
        raise ValueError("bad value")
    assert capture_call_output(print, "hi") == "hi\n"
    ok = execute_subprocess_async([sys.executable, "-c", "print(1)"], quiet=True, echo=False)
    assert ok.stdout == ["1"]
    with pytest.raises(RuntimeError, match="exit code 3"):
        execute_subprocess_async([sys.executable, "-c", "raise SystemExit(3)"], quiet=True)


# ---------------------------------------------------------------- 1 and 2 real processes
@pytest.mark.parametrize("world_size", [1, 2])
def test_surface_methods_on_real_processes(tmp_path, world_size):
    results = spawn_workers(
        surface_workers.surface_job, world_size, args=(str(tmp_path),), timeout=300
    )
    print(json.dumps(results))
    for out in results:
        assert out["trigger_before"] is False and out["trigger_after_set"] is True
        assert out["trigger_after_seen"] is False
        assert out["trigger_sync_same"] and out["local_sgd_same_after_exit"]
        assert out["trace_events"] > 0 and out["profiled_mm"] and out["profiler_averages"]
        assert (tmp_path / "traces" / f"profile_{out['rank']}.json").is_file()
        assert out["partial_alive"] and "_reset_state()" in out["prepare_after_reset"]
        assert out["fresh_reduce"] == world_size
    if world_size == 1:
        (out,) = results
        assert out["fp16_hooks"] == 0 and out["join_batches"] == 5
        assert out["debug_error"] is None
        return
    assert [out["join_batches"] for out in results] == [3, 2]
    for out in results:
        assert out["fp16_hooks"] == 1 and out["fp16_grad_is_half"]
        assert out["fp16_grad"] == pytest.approx([5 / 3] * 4, abs=1e-3)
        assert out["power_sgd_hooks"] == 1 and out["power_sgd_rank"] == 1
        assert out["power_sgd_full_rank"] > 1 and out["power_sgd_is_half"]
        assert out["power_sgd_same"]
        assert out["even_batches_restored"] is True and out["batches_after_join"] == 3
        assert out["no_sync_same"] is False
        assert out["local_sgd_same"] == [False, True, False]
        assert out["debug_error"] == "DistributedOperationError"


# ---------------------------------------------------------------- the coverage script
def test_coverage_script_classifies_and_renders_the_coverage_page(capsys, coverage_script):
    script = coverage_script

    def theirs(a, b, c):
        return a

    def ours(a, b):
        return a

    assert script.classify("accelerate.utils", "f", True, theirs, theirs).status == "same"
    differs = script.classify("accelerate.utils", "f", True, theirs, ours)
    assert (differs.status, differs.note) == ("differs", "lacks parameters c")
    enum_gap = script.classify(
        "accelerate.utils", "DistributedType", True, DistributedType, DynamoBackend
    )
    assert enum_gap.status == "differs" and "MULTI_CPU" in enum_gap.note
    absent = script.classify("accelerate.utils", "get_model_tp_size", False, None, None)
    assert absent.status == "absent" and "parallelism" in absent.note
    assert script.classify("accelerate.utils", "brand_new", False, None, None).note == ""

    entries = [
        script.Entry("accelerate", "Accelerator", "same", ""),
        script.Entry("accelerate.utils", "brand_new", "absent", ""),
    ]
    text = script.render("9.9", entries)
    assert text.startswith("Compared with Accelerate 9.9:")
    assert "| `accelerate` | 1 | 1 | 0 | 0 | 0 | 0 |" in text
    assert "| (no reason recorded) | `accelerate.utils`: `brand_new` |" in text

    assert script.main(["--check"], collector=lambda: ("9.9", entries)) == 1
    assert "absent without a recorded reason: accelerate.utils.brand_new" in capsys.readouterr().err


def test_coverage_check_fails_on_a_signature_difference_without_a_notes_entry(
    capsys, coverage_script
):
    script = coverage_script
    undeclared = [script.Entry("accelerate.utils", "brand_new", "differs", "lacks parameters c")]
    assert script.main(["--check"], collector=lambda: ("9.9", undeclared)) == 1
    assert "accelerate.utils.brand_new (lacks parameters c)" in capsys.readouterr().err
    assert script.main([], collector=lambda: ("9.9", undeclared)) == 0  # printing only
    declared = [script.Entry("Accelerator", "unwrap_model", "differs", "noted")]
    assert ("Accelerator", "unwrap_model") in script.NOTES
    assert script.main(["--check"], collector=lambda: ("9.9", declared)) == 0


def test_strategy_facts_and_device_map_check_on_one_process():
    accelerator = Accelerator(cpu=True)
    assert accelerator.deepspeed_plugin is None
    assert accelerator.is_fsdp2 is False
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    assert accelerator.verify_device_map(model) is False
    model.hf_device_map = {"0": "cpu", "1": "disk"}
    assert accelerator.verify_device_map(model) is True
    model.hf_device_map = {"0": "cpu", "1": "cpu"}
    assert accelerator.verify_device_map(model) is False


def test_fsdp_merge_and_size_helpers_under_accelerate_names(tmp_path):
    from torch.distributed.checkpoint.state_dict_saver import save

    from accel.utils import (
        convert_file_size_to_int,
        cpu_offload,
        dtype_byte_size,
        has_offloaded_params,
        load_checkpoint_in_model,
        merge_fsdp_weights,
    )

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    folder = tmp_path / "checkpoint" / "fsdp_model_0"
    save({"model": model.state_dict()}, checkpoint_id=folder, **local_dcp_options())
    merge_fsdp_weights(folder, tmp_path / "merged", remove_checkpoint_dir=True)
    assert not folder.exists()
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    load_checkpoint_in_model(plain, tmp_path / "merged")
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in model.state_dict().items())

    assert convert_file_size_to_int("2KB") == 2000 and convert_file_size_to_int("1KiB") == 1024
    assert dtype_byte_size(torch.bfloat16) == 2 and dtype_byte_size(torch.bool) == 1 / 8
    assert not has_offloaded_params(model[0])
    cpu_offload(model, execution_device="cpu")
    assert has_offloaded_params(model[0])
    # Regression: an offload hook chained with another one (a SequentialHook) still counts.
    from accel_ckpt.big_modeling.hooks import ModelHook, add_hook_to_module

    add_hook_to_module(model[0], ModelHook(), append=True)
    assert type(model[0]._hf_hook).__name__ == "SequentialHook"
    assert has_offloaded_params(model[0])
