"""accel.utils names and module paths added for Accelerate parity, on one process.

Constants against a real save_state folder, version comparison, the module paths (offload,
rich, tqdm, versions, constants, accel.memory_utils), precision helpers, in-place regional
compilation, GatheredParameters without ZeRO-3, is_peft_model.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import sys
import warnings

import pytest
import torch

import accel.utils
from accel import Accelerator
from accel.utils import (
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_PATTERN_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_PATTERN_NAME,
    GatheredParameters,
    compare_versions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    get_current_device_type,
    get_grad_scaler,
    get_mixed_precision_context_manager,
    has_compiled_regions,
    is_peft_model,
)
from accel.utils.constants import FSDP_MODEL_NAME, STR_OPERATION_TO_FUNC
from accel_state import DistributedType, reset_state


@pytest.fixture
def accelerator() -> Accelerator:
    reset_state()
    yield Accelerator(cpu=True)
    reset_state()


def test_constants_name_the_files_save_state_writes(accelerator, tmp_path):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.save_state(tmp_path / "ckpt")
    stems = {path.name.split(".")[0] for path in (tmp_path / "ckpt").iterdir()}
    assert {SAFE_MODEL_NAME, OPTIMIZER_NAME, SCHEDULER_NAME, f"{RNG_STATE_NAME}_0"} <= stems
    accelerator.save_state(tmp_path / "pickled", safe_serialization=False)
    assert (tmp_path / "pickled" / f"{MODEL_NAME}.bin").is_file()
    # Accelerate's values, which scripts format themselves.
    assert SCALER_NAME == "scaler.pt" and SAMPLER_NAME == "sampler"
    assert FSDP_MODEL_NAME == "pytorch_model_fsdp"
    assert WEIGHTS_PATTERN_NAME.format(suffix="-00001") == "pytorch_model-00001.bin"
    assert SAFE_WEIGHTS_PATTERN_NAME.format(suffix="") == "model.safetensors"


def test_compare_versions_reads_installed_libraries_and_version_strings():
    torch_version = importlib.metadata.version("torch")
    assert compare_versions("torch", "==", torch_version)
    assert compare_versions("torch", ">=", "2.0")
    assert not compare_versions("2.1.0", ">", "2.10")  # numeric, not lexical
    assert compare_versions("1.0.0rc1", "<", "1.0.0")
    assert set(STR_OPERATION_TO_FUNC) == {">", ">=", "==", "!=", "<=", "<"}
    with pytest.raises(ValueError, match="operation='=>'"):
        compare_versions("1.0", "=>", "1.0")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        compare_versions("no-such-library-here", ">=", "1.0")
    versions = importlib.import_module("accel.utils.versions")
    assert versions.is_torch_version(">=", "2.0")


@pytest.mark.parametrize(
    "path",
    ["accel.utils.constants", "accel.utils.versions", "accel.utils.offload", "accel.utils.tqdm"],
)
def test_accelerate_module_paths_import(path):
    module = importlib.import_module(path)
    assert module.__all__
    for name in module.__all__:
        assert hasattr(module, name)


def test_tqdm_stays_callable_whichever_way_it_is_imported():
    importlib.import_module("accel.utils.tqdm")
    bar = accel.utils.tqdm(range(3), disable=True)  # the module when imported as a path
    assert list(bar) == [0, 1, 2]
    from accel.utils.tqdm import tqdm

    assert list(tqdm(range(2), main_process_only=False, disable=True)) == [0, 1]


def test_rich_module_needs_rich(monkeypatch):
    monkeypatch.delitem(sys.modules, "accel.utils.rich", raising=False)
    if importlib.util.find_spec("rich") is None:
        with pytest.raises(ModuleNotFoundError, match="pip install rich"):
            importlib.import_module("accel.utils.rich")
    else:
        importlib.import_module("accel.utils.rich")
        assert "rich.traceback" in sys.modules


def test_memory_utils_warns_and_reexports(monkeypatch):
    monkeypatch.delitem(sys.modules, "accel.memory_utils", raising=False)
    with pytest.warns(FutureWarning, match="accel.utils.memory"):
        module = importlib.import_module("accel.memory_utils")
    assert module.find_executable_batch_size is accel.utils.find_executable_batch_size


def test_offload_module_round_trips_a_weight(tmp_path):
    from accel.utils.offload import OffloadedWeightsLoader, offload_state_dict

    weights = {"w": torch.arange(4.0)}
    offload_state_dict(tmp_path, weights)
    assert torch.equal(OffloadedWeightsLoader(save_folder=tmp_path)["w"], weights["w"])


def test_grad_scaler_and_device_type_on_this_machine():
    device_type, distributed_type = get_current_device_type()
    if not torch.cuda.is_available():
        assert (device_type, distributed_type) == ("cpu", "MULTI_CPU")
    scaler = get_grad_scaler(init_scale=4.0)
    assert isinstance(scaler, torch.amp.GradScaler)
    assert scaler.scale(torch.ones(1, device=device_type)).item() == 4.0
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    assert isinstance(get_grad_scaler(DistributedType.FSDP), ShardedGradScaler)


def test_mixed_precision_context_manager_follows_the_state():
    reset_state()
    try:
        Accelerator(cpu=True, mixed_precision="bf16")
        with get_mixed_precision_context_manager(native_amp=True):
            out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
        assert out.dtype == torch.bfloat16
        plain = get_mixed_precision_context_manager()
        assert isinstance(plain, contextlib.nullcontext)
    finally:
        reset_state()


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(3, 3) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_regional_compilation_in_place_keeps_the_object():
    model = Stack()
    expected = model(torch.ones(1, 3))
    assert compile_regions_fsdp2(model, backend="eager") is model
    assert has_compiled_regions(model)
    assert torch.allclose(model(torch.ones(1, 3)), expected)

    engine_like = torch.nn.Module()
    engine_like.module = Stack()
    assert compile_regions_deepspeed(engine_like, backend="eager") is None
    assert has_compiled_regions(engine_like.module)


def test_gathered_parameters_without_zero3_runs_the_block_and_keeps_edits():
    layer = torch.nn.Linear(2, 2)
    with GatheredParameters(layer.parameters(), modifier_rank=0), torch.no_grad():
        layer.weight.fill_(3.0)
    assert torch.all(layer.weight == 3.0)
    with GatheredParameters(layer.weight, enabled=False):
        pass


def test_is_peft_model_false_for_plain_modules():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert is_peft_model(torch.nn.Linear(2, 2)) is False


def test_gpu_facts_without_cuda_initialisation(monkeypatch):
    from accel.utils import are_libraries_initialized, check_cuda_p2p_ib_support, get_gpu_info

    assert are_libraries_initialized("torch", "surely_not_imported_here") == ["torch"]
    from accel.utils.environment import get_driver_version

    monkeypatch.setenv("PATH", "")  # the environment: no NVIDIA driver tools
    with pytest.raises(FileNotFoundError, match="nvidia-smi"):
        get_gpu_info()
    with pytest.raises(FileNotFoundError, match="nvidia-smi"):
        get_driver_version()
    assert check_cuda_p2p_ib_support() is True


def test_availability_checks_at_accelerates_imports_path():
    import accel.utils.imports as imports

    assert imports.is_tqdm_available() is True  # accel-launch depends on tqdm
    assert imports.is_torch_distributed_available() is torch.distributed.is_available()
    numpy_installed = importlib.util.find_spec("numpy") is not None
    assert imports.is_numpy_available() is numpy_installed
    assert imports.is_numpy_available("999.0") is False
    assert imports.deepspeed_required is accel.utils.deepspeed_required
    assert imports.torchao_required is accel.utils.torchao_required
    assert accel.utils.is_numpy_available is imports.is_numpy_available
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        imports.not_a_name  # noqa: B018


def test_use_torch_xla_0_turns_torch_xla_off(monkeypatch):
    import accel.utils.imports as imports

    monkeypatch.setattr(imports, "USE_TORCH_XLA", False)
    assert imports.is_torch_xla_available() is False
    assert imports.is_torch_xla_available(check_is_tpu=True) is False


def test_versions_torch_version_and_launchers_test_launch():
    from accel.launchers import test_launch
    from accel.utils.versions import torch_version

    assert torch_version == torch.__version__
    assert torch_version >= "2.0"
    reset_state()
    try:
        test_launch()  # a PartialState of one process, as a launched function starts
        from accel_state import PartialState

        assert PartialState().num_processes == 1
    finally:
        reset_state()


def test_install_xla_refuses_naming_the_command():
    from accel.errors import UnsupportedFeatureError
    from accel.utils import install_xla

    with pytest.raises(UnsupportedFeatureError, match=r"pip install -U torch && pip install"):
        install_xla(upgrade=True)


def test_get_model_tp_size_reads_transformers_attributes():
    from types import SimpleNamespace

    from accel.utils import get_model_tp_size, model_has_dtensor

    model = torch.nn.Linear(2, 2)
    assert get_model_tp_size(model) is None and not model_has_dtensor(model)
    model.tp_size = 4
    assert get_model_tp_size(model) == 4
    other = torch.nn.Linear(2, 2)
    other.config = SimpleNamespace(distributed_config={"tp_size": 2})
    assert get_model_tp_size(other) == 2


def test_requirement_decorators(monkeypatch, accelerator):
    from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
    from accel.utils import deepspeed_required, imports, requirements, torchao_required

    # Defined where Accelerate keeps them; accel's older path hands out the same objects.
    assert requirements.torchao_required is imports.torchao_required is torchao_required

    @deepspeed_required
    def needs_deepspeed() -> str:
        return "ran"

    with pytest.raises(AcceleratorConfigError, match="needs_deepspeed needs DeepSpeed"):
        needs_deepspeed()

    @torchao_required
    def needs_torchao() -> str:
        return "ran"

    monkeypatch.setattr(imports, "is_torchao_available", lambda: False)
    with pytest.raises(UnsupportedFeatureError, match=r"accel\[fp8\]"):
        needs_torchao()
    monkeypatch.setattr(imports, "is_torchao_available", lambda: True)
    assert needs_torchao() == "ran"


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("MegatronLMPlugin", ()),
        ("MegatronLMDummyScheduler", (None,)),
        ("GPTTrainStep", (None, None)),
        ("avg_losses_across_data_parallel_group", ([],)),
    ],
)
def test_megatron_names_refuse_with_the_reason(name, args):
    from accel.errors import UnsupportedFeatureError

    with pytest.raises(UnsupportedFeatureError, match="Megatron-LM"):
        getattr(accel.utils, name)(*args)


def test_sagemaker_enum_has_accelerates_members():
    from accel.utils import SageMakerDistributedType

    assert [member.value for member in SageMakerDistributedType] == [
        "NO",
        "DATA_PARALLEL",
        "MODEL_PARALLEL",
    ]


def test_convert_model_refuses_the_reverse_direction_and_names_transformer_engine():
    from accel.errors import UnsupportedFeatureError
    from accel.utils import convert_model

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
    before = [type(layer) for layer in model]
    with pytest.raises(UnsupportedFeatureError, match=r"to_transformer_engine=False.*save_model"):
        convert_model(model, to_transformer_engine=False)
    if importlib.util.find_spec("transformer_engine") is None:
        with pytest.raises(UnsupportedFeatureError, match="transformer-engine"):
            convert_model(model)
    assert [type(layer) for layer in model] == before  # a refusal leaves the model as it was


def test_convert_dict_to_env_variables_warns_on_accelerates_logger_path(caplog):
    from accel.utils.environment import convert_dict_to_env_variables

    env = {"ACCELERATE_DEBUG_MODE": "1", "BAD_ENV_NAME": "<mything", "OTHER_ENV": "2"}
    with caplog.at_level("WARNING", logger="accel.utils.environment"):
        lines = convert_dict_to_env_variables(env)
    assert lines == ["ACCELERATE_DEBUG_MODE=1\n", "OTHER_ENV=2\n"]
    skipped = [r for r in caplog.records if r.name == "accel.utils.environment"]
    assert len(skipped) == 1 and "BAD_ENV_NAME" in skipped[0].getMessage()
    assert accel.utils.convert_dict_to_env_variables is convert_dict_to_env_variables


def test_fallback_allocate_is_reexported_at_accelerates_path():
    import accel.utils.modeling
    from accel_ckpt.big_modeling.planning import fallback_allocate

    assert accel.utils.modeling.fallback_allocate is fallback_allocate
