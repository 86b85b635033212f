import pytest

from accel_state import EnvironmentConfigError, LaunchContract, PrecisionType
from accel_state import contract as names


def test_defaults_when_nothing_is_set():
    contract = LaunchContract.from_env({})
    assert contract == LaunchContract()
    assert contract.mixed_precision is PrecisionType.NO
    assert contract.gradient_accumulation_steps == 1
    assert not contract.debug


def test_every_variable_of_the_contract_has_a_meaning_for_the_docs():
    """The docs' environment reference is generated from VARIABLE_DESCRIPTIONS."""
    assert set(names.ALL_VARIABLES) <= set(names.VARIABLE_DESCRIPTIONS)
    assert all(text.strip() for text in names.VARIABLE_DESCRIPTIONS.values())
    assert all(name.isupper() for name in names.VARIABLE_DESCRIPTIONS)


def test_round_trip_through_the_environment():
    contract = LaunchContract(
        mixed_precision="bf16",
        use_cpu=True,
        gradient_accumulation_steps=4,
        debug=True,
        dynamo_backend="inductor",
        dynamo_mode="reduce-overhead",
        dynamo_use_fullgraph=True,
        dynamo_use_dynamic=False,
        dynamo_use_regional_compilation=True,
        use_fsdp=True,
        fsdp_config={"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_offload_params": False},
        backend="gloo",
        process_group_timeout=42.5,
        downcast_bf16=True,
        fp8_backend="AO",
        fp8_config={"pad_inner_dim": True, "enable_fsdp_float8_all_gather": False},
        torch_device="cuda:1",
    )
    environ = contract.to_env()
    ours = {name for name in environ if name.startswith("ACCEL_")}
    assert ours <= set(names.ALL_VARIABLES)
    assert LaunchContract.from_env(environ) == contract
    # Accelerate's spellings of the same settings come too, with accelerate launch's values.
    assert environ["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert environ["ACCELERATE_USE_CPU"] == "True"
    assert environ["ACCELERATE_DEBUG_MODE"] == "true"
    assert environ["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == "4"
    assert environ["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
    assert environ["ACCELERATE_DYNAMO_MODE"] == "reduce-overhead"
    assert environ["ACCELERATE_USE_FSDP"] == "true"
    assert environ["FSDP_VERSION"] == "1"
    assert environ["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD"
    assert environ["FSDP_OFFLOAD_PARAMS"] == "false"
    assert environ["ACCELERATE_FP8_BACKEND"] == "AO"
    assert environ["ACCELERATE_TORCH_DEVICE"] == "cuda:1"
    assert set(environ) - ours <= {
        name for name in environ if name.startswith(("ACCELERATE_", "FSDP_"))
    }


def test_accelerates_variables_alone_are_read():
    """A script started by hand with Accelerate's variables (or by accelerate launch)."""
    accelerate_only = {
        "ACCELERATE_MIXED_PRECISION": "fp16",
        "ACCELERATE_USE_CPU": "True",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "3",
        "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT": "true",
        "ACCELERATE_GRADIENT_CLIPPING": "1.5",
    }
    contract = LaunchContract.from_env(accelerate_only)
    assert contract.mixed_precision is PrecisionType.FP16
    assert contract.use_cpu is True
    assert contract.gradient_accumulation_steps == 3
    assert contract.use_deepspeed is True
    assert contract.deepspeed_config == {
        "zero_stage": 3,
        "offload_optimizer_device": "cpu",
        "zero3_init_flag": True,
        "gradient_clipping": 1.5,
    }


def test_accels_own_variable_wins_over_accelerates():
    environ = {"ACCEL_MIXED_PRECISION": "bf16", "ACCELERATE_MIXED_PRECISION": "fp16"}
    assert LaunchContract.from_env(environ).mixed_precision is PrecisionType.BF16


def test_deepspeed_settings_become_accelerates_variables():
    contract = LaunchContract(
        use_deepspeed=True,
        deepspeed_config={"zero_stage": 2, "gradient_clipping": 1.0, "zero3_init_flag": False},
    )
    environ = contract.to_env()
    assert environ["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert environ["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"
    assert environ["ACCELERATE_GRADIENT_CLIPPING"] == "1.0"
    assert environ["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "false"
    assert "ACCELERATE_USE_FSDP" not in environ


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        (names.MIXED_PRECISION, "fp64", "ACCEL_MIXED_PRECISION='fp64'"),
        (names.GRADIENT_ACCUMULATION_STEPS, "0", "must be >= 1"),
        (names.GRADIENT_ACCUMULATION_STEPS, "two", "is not an integer"),
        (names.DEBUG_MODE, "maybe", "is not a boolean"),
        (names.DEEPSPEED_CONFIG, "{not json", "is not valid JSON"),
        (names.FSDP_CONFIG, "[1, 2]", "must hold a JSON object"),
        (names.BACKEND, "carrier-pigeon", "ACCEL_BACKEND='carrier-pigeon'"),
        (names.PROCESS_GROUP_TIMEOUT, "-3", "positive"),
        (names.FP8_BACKEND, "fp4", "not an fp8 backend"),
        (names.FP8_CONFIG, "[]", "must hold a JSON object"),
    ],
)
def test_malformed_values_name_the_variable(variable, value, fragment):
    with pytest.raises(EnvironmentConfigError) as raised:
        LaunchContract.from_env({variable: value})
    assert fragment in str(raised.value)
    assert variable in str(raised.value) or variable.removeprefix("ACCEL_").lower() in str(
        raised.value
    )


def test_deepspeed_and_fsdp_together_is_an_error():
    with pytest.raises(EnvironmentConfigError, match="ACCEL_USE_DEEPSPEED and ACCEL_USE_FSDP"):
        LaunchContract.from_env({names.USE_DEEPSPEED: "1", names.USE_FSDP: "true"})
    with pytest.raises(EnvironmentConfigError, match="one model-sharding strategy"):
        LaunchContract(use_deepspeed=True, use_fsdp=True)


def test_contract_module_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; import accel_state.contract, accel_state.types, accel_state.envvars; "
        "from accel_state import LaunchContract, DistributedType; "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_accelerate_fsdp_variables_are_read_when_accel_sends_none():
    contract = LaunchContract.from_env(
        {
            "ACCELERATE_USE_FSDP": "true",
            "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP",
            "FSDP_TRANSFORMER_CLS_TO_WRAP": "BertLayer",
            "FSDP_OFFLOAD_PARAMS": "false",
            "FSDP_MIN_NUM_PARAMS": "1000",
        }
    )
    assert contract.use_fsdp
    assert contract.fsdp_config == {
        "fsdp_sharding_strategy": "SHARD_GRAD_OP",
        "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
        "fsdp_offload_params": False,
        "fsdp_min_num_params": 1000,
    }
    # accel's own JSON wins over Accelerate's variables.
    mine = LaunchContract.from_env(
        {names.USE_FSDP: "1", names.FSDP_CONFIG: '{"fsdp_version": 1}', "FSDP_VERSION": "2"}
    )
    assert mine.fsdp_config == {"fsdp_version": 1}


def test_accelerate_fp8_variables_are_read_as_recipe_fields():
    contract = LaunchContract.from_env(
        {
            "ACCELERATE_FP8_BACKEND": "te",
            "ACCELERATE_FP8_MARGIN": "2",
            "ACCELERATE_FP8_FORMAT": "E4M3",
            "ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL": "True",
            "ACCELERATE_FP8_OVERRIDE_DGRAD": "true",
            "ACCELERATE_FP8_PAD_INNER_DIM": "false",
        }
    )
    assert contract.fp8_backend == "TE"
    assert contract.fp8_config == {
        "margin": 2,
        "fp8_format": "E4M3",
        "use_autocast_during_eval": True,
        "override_linear_precision": [False, True, False],
        "pad_inner_dim": False,
    }
    # accel's own variables win over Accelerate's.
    ours = LaunchContract.from_env(
        {names.FP8_BACKEND: "AO", names.FP8_CONFIG: "{}", "ACCELERATE_FP8_BACKEND": "TE"}
    )
    assert ours.fp8_backend == "AO"


def test_accelerates_dynamo_and_device_variables_are_read_where_accels_are_not_set():
    # Regression: ACCELERATE_DYNAMO_* and ACCELERATE_TORCH_DEVICE were ignored.
    accelerate = {
        "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR",
        "ACCELERATE_DYNAMO_MODE": "max-autotune",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": "true",
        "ACCELERATE_DYNAMO_USE_DYNAMIC": "false",
        "ACCELERATE_TORCH_DEVICE": "cuda:3",
    }
    contract = LaunchContract.from_env(accelerate)
    assert (contract.dynamo_backend, contract.dynamo_mode) == ("inductor", "max-autotune")
    assert contract.dynamo_use_fullgraph and contract.dynamo_use_dynamic is False
    assert contract.torch_device == "cuda:3"
    own = {**accelerate, "ACCEL_DYNAMO_BACKEND": "eager", "ACCEL_TORCH_DEVICE": "cpu"}
    contract = LaunchContract.from_env(own)
    assert (contract.dynamo_backend, contract.torch_device) == ("eager", "cpu")
