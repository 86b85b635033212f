import importlib.util
import json

import pytest
from launch_helpers import DATA, SCRIPTS

from accel_launch.config import AccelConfig, FsdpConfig, read_config_file
from accel_launch.errors import ConfigError, LaunchArgumentError
from accel_launch.hardware import cpu_count
from accel_launch.launch_args import build_launch_parser
from accel_launch.plan import build_plan, parse_rdzv_conf
from accel_state import contract
from accel_state.contract import FSDP_CONFIG, USE_PARALLELISM_CONFIG, LaunchContract

SCRIPT = str(SCRIPTS / "plain_worker.py")
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def plan_for(*flags, config=None, env=None, script=SCRIPT):
    args = build_launch_parser().parse_args([*flags, script, "out", "--lr", "3"])
    return build_plan(args, config, {**NO_GPU, **(env or {})})


def test_script_args_pass_through_untouched():
    plan = plan_for("--cpu")
    assert plan.target == SCRIPT and plan.target_args == ("out", "--lr", "3")
    assert plan.python_command()[1:] == ["-u", SCRIPT, "out", "--lr", "3"]


def test_single_process_runs_directly_without_torchrun_variables():
    plan = plan_for("--cpu")
    assert plan.mode == "single" and plan.num_processes == 1
    assert "RANK" not in plan.env and "WORLD_SIZE" not in plan.env
    assert plan.env["OMP_NUM_THREADS"] == str(cpu_count())  # the multi-process rule, for 1
    assert LaunchContract.from_env(plan.env).use_cpu is True
    assert any("num_processes" in note for note in plan.notes)


def test_multi_process_goes_through_elastic_with_a_free_port():
    plan = plan_for("--cpu", "--num_processes", "3")
    assert plan.mode == "elastic" and plan.nproc_per_node == 3
    assert (plan.rdzv_backend, plan.rdzv_endpoint) == ("c10d", "127.0.0.1:0")


def test_one_machine_always_uses_c10d_and_honours_a_port():
    plan = plan_for("--cpu", "--num_processes", "2", "--main_process_port", "29555")
    assert (plan.rdzv_backend, plan.rdzv_endpoint) == ("c10d", "127.0.0.1:29555")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan.env


def test_restarts_get_a_fresh_store_per_round():
    plan = plan_for("--cpu", "--num_processes", "2", "--max_restarts", "2")
    assert plan.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_each_agent_numbers_its_own_workers_unless_the_user_chose():
    # Every machine runs the same number of processes: no store exchange after a round.
    plan = plan_for("--cpu", "--num_processes", "2")
    assert plan.env["TORCH_ELASTIC_WORKER_IDENTICAL"] == "1"
    args = build_launch_parser().parse_args(["--cpu", "--num_processes", "2", SCRIPT])
    chosen = build_plan(
        args, None, {"CUDA_VISIBLE_DEVICES": "", "TORCH_ELASTIC_WORKER_IDENTICAL": "0"}
    )
    assert "TORCH_ELASTIC_WORKER_IDENTICAL" not in chosen.env  # the user's own value stays
    single = plan_for("--cpu", "--num_processes", "1")
    assert single.mode == "single" and "TORCH_ELASTIC_WORKER_IDENTICAL" not in single.env


def test_num_processes_is_total_across_machines():
    plan = plan_for(
        "--cpu",
        "--num_processes",
        "4",
        "--num_machines",
        "2",
        "--machine_rank",
        "1",
        "--main_process_ip",
        "10.0.0.1",
    )
    assert (plan.nproc_per_node, plan.num_machines, plan.machine_rank) == (2, 2, 1)
    assert plan.rdzv_endpoint == "10.0.0.1:29500" and plan.rdzv_backend == "static"
    ipv6 = plan_for(
        "--cpu", "--num_processes", "2", "--num_machines", "2", "--main_process_ip", "::1"
    )
    assert ipv6.rdzv_endpoint == "[::1]:29500"


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (
            ["--num_processes", "5", "--num_machines", "2", "--main_process_ip", "h"],
            "not a multiple",
        ),
        (["--num_processes", "4", "--num_machines", "2"], "--main_process_ip"),
        (
            ["--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "h"],
            "--machine_rank 2",
        ),
        (["--use_fsdp", "--use_deepspeed"], "cannot be combined"),
        (["-m", "--no_python"], "cannot be combined"),
        (["--rdzv_conf", "timeout"], "--rdzv_conf"),
    ],
)
def test_bad_combinations_are_explained(flags, match):
    with pytest.raises(LaunchArgumentError, match=match):
        plan_for("--cpu", *flags)


def test_missing_script_is_reported():
    with pytest.raises(LaunchArgumentError, match="does not exist"):
        plan_for("--cpu", script="missing.py")
    assert plan_for("-m", script="some.module").module


@pytest.mark.parametrize(
    "argv",
    [
        ["--mixed_precision", "fp32", "x.py"],
        ["--zero_stage", "7", "x.py"],
        ["--fsdp_offload_params", "sure", "x.py"],
    ],
)
def test_invalid_flag_values_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as info:
        build_launch_parser().parse_args(argv)
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_flag_values_are_validated_like_file_values():
    with pytest.raises(ConfigError, match="--num_processes=0"):
        plan_for("--num_processes", "0")
    with pytest.raises(ConfigError, match="--main_process_port=0"):
        plan_for("--main_process_port", "0")


def test_flags_override_config_file_values():
    config = read_config_file(DATA / "fsdp_seed.yaml")
    plan = plan_for(
        "--cpu",
        "--mixed_precision",
        "fp16",
        "--num_processes",
        "3",
        "--fsdp_offload_params",
        "true",
        "--fsdp_sharding_strategy",
        "shard_grad_op",
        config=config,
    )
    assert plan.num_processes == 3 and plan.mode == "elastic"
    contract = LaunchContract.from_env(plan.env)
    assert contract == plan.contract
    assert contract.mixed_precision == "fp16" and contract.use_fsdp and contract.use_cpu
    fsdp = contract.fsdp_config
    assert fsdp["fsdp_offload_params"] is True and fsdp["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "BertLayer"  # from the file


def test_config_file_values_apply_when_no_flag():
    config = AccelConfig(
        num_processes=2,
        use_cpu=True,
        mixed_precision="bf16",
        gradient_accumulation_steps=4,
        debug=True,
        dynamo_config=read_config_file(DATA / "fsdp_seed.yaml").dynamo_config,
    )
    plan = plan_for(config=config)
    contract = plan.contract
    assert (plan.num_processes, contract.mixed_precision, contract.gradient_accumulation_steps) == (
        2,
        "bf16",
        4,
    )
    assert contract.debug and contract.use_cpu and contract.dynamo_backend == "no"
    assert plan.notes == ()


def test_deepspeed_settings_reach_the_contract():
    plan = plan_for(
        "--use_deepspeed",
        "--zero_stage",
        "3",
        "--offload_param_device",
        "cpu",
        "--gradient_accumulation_steps",
        "8",
        "--gradient_clipping",
        "0.5",
        "--zero3_init_flag",
        "true",
        "--num_processes",
        "2",
    )
    contract = LaunchContract.from_env(plan.env)
    assert contract.use_deepspeed and not contract.use_fsdp
    assert contract.gradient_accumulation_steps == 8
    assert contract.deepspeed_config == {
        "zero_stage": 3,
        "offload_param_device": "cpu",
        "gradient_clipping": 0.5,
        "zero3_init_flag": True,
        "gradient_accumulation_steps": 8,
    }


def test_deepspeed_flags_without_deepspeed_are_reported():
    plan = plan_for("--cpu", "--zero_stage", "2")
    assert any("zero_stage" in note for note in plan.notes)
    assert plan.contract.deepspeed_config == {}


def test_deepspeed_pdsh_multinode_is_refused():
    with pytest.raises(LaunchArgumentError, match="standard"):
        plan_for(
            "--use_deepspeed",
            "--deepspeed_multinode_launcher",
            "pdsh",
            "--num_machines",
            "2",
            "--main_process_ip",
            "h",
            "--num_processes",
            "2",
        )


def test_dynamo_flags():
    plan = plan_for(
        "--cpu",
        "--dynamo_backend",
        "inductor",
        "--dynamo_mode",
        "reduce-overhead",
        "--dynamo_use_fullgraph",
    )
    contract = LaunchContract.from_env(plan.env)
    assert (contract.dynamo_backend, contract.dynamo_mode, contract.dynamo_use_fullgraph) == (
        "inductor",
        "reduce-overhead",
        True,
    )
    assert contract.dynamo_use_dynamic is None


def test_thread_count_rules():
    cpu = plan_for("--cpu", "--num_processes", "2")
    assert cpu.env["OMP_NUM_THREADS"] == str(max(1, cpu_count() // 2))
    inherited = plan_for("--cpu", "--num_processes", "2", env={"OMP_NUM_THREADS": "7"})
    assert "OMP_NUM_THREADS" not in inherited.env
    explicit = plan_for(
        "--cpu",
        "--num_processes",
        "2",
        "--num_cpu_threads_per_process",
        "3",
        env={"OMP_NUM_THREADS": "7"},
    )
    assert explicit.env["OMP_NUM_THREADS"] == "3"
    # One process follows the same rules: cores // 1 on CPU, the user's value, an inherited one.
    single = plan_for("--cpu")
    assert single.mode == "single" and single.env["OMP_NUM_THREADS"] == str(cpu_count())
    assert plan_for("--cpu", "--num_cpu_threads_per_process", "3").env["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in plan_for("--cpu", env={"OMP_NUM_THREADS": "7"}).env
    assert "OMP_NUM_THREADS" not in plan_for(env={"CUDA_VISIBLE_DEVICES": "0"}).env  # one GPU


def test_downcast_bf16_acts_on_xla_and_is_refused_elsewhere():
    plan = plan_for("--tpu", "--mixed_precision", "bf16", "--downcast-bf16")
    assert plan.env["XLA_DOWNCAST_BF16"] == "1"
    assert LaunchContract.from_env(plan.env).downcast_bf16 is True
    assert "XLA_DOWNCAST_BF16" not in plan_for("--tpu", "--mixed_precision", "bf16").env
    with pytest.raises(LaunchArgumentError, match="--downcast_bf16 only applies to XLA"):
        plan_for("--cpu", "--downcast_bf16")
    with pytest.raises(LaunchArgumentError, match="--mixed_precision bf16"):
        plan_for("--tpu", "--downcast_bf16")
    # Accelerate's config files carry downcast_bf16 for every machine; off XLA it does nothing.
    from_file = AccelConfig(downcast_bf16=True, mixed_precision="bf16")
    assert "XLA_DOWNCAST_BF16" not in plan_for("--cpu", config=from_file).env


def test_flags_a_one_process_launch_cannot_use_are_named():
    plan = plan_for(
        "--cpu", "--tee", "3", "--monitor_interval", "1", "--main_training_function", "f"
    )
    assert any("--tee, --monitor_interval only act on multi-process" in n for n in plan.notes)
    assert any("--main_training_function only acts on XLA" in n for n in plan.notes)
    assert not any("only act" in n for n in plan_for("--cpu", "--num_processes", "2").notes)
    static = plan_for("--cpu", "--num_processes", "2", "--rdzv_backend", "static")
    assert static.rdzv_backend == "c10d"
    assert any("--rdzv_backend static is for several machines" in n for n in static.notes)


def test_gpu_ids_select_devices_and_default_process_count():
    plan = plan_for("--gpu_ids", "1,3", "--multi_gpu", env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "1,3" and plan.num_processes == 2
    assert plan.env["OMP_NUM_THREADS"] == "1"
    assert plan_for(env={"CUDA_VISIBLE_DEVICES": "0,1,2"}).num_processes == 3


def test_distributed_modes():
    assert plan_for("--multi_gpu", "--num_processes", "1").mode == "elastic"
    assert plan_for("--cpu", "--max_restarts", "1").mode == "elastic"
    assert plan_for("--tpu").mode == "xla"
    assert plan_for("--tpu").num_processes is None
    assert plan_for(config=AccelConfig(distributed_type="MULTI_CPU", num_processes=1)).use_cpu
    with pytest.raises(LaunchArgumentError, match="MEGATRON_LM"):
        plan_for(config=AccelConfig(distributed_type="MEGATRON_LM"))
    with pytest.raises(LaunchArgumentError, match="SAGEMAKER"):
        plan_for(config=AccelConfig(compute_environment="AMAZON_SAGEMAKER"))


def test_rdzv_conf_parsing():
    assert parse_rdzv_conf("timeout=60, join_timeout = 30,is_host=false") == {
        "timeout": 60,
        "join_timeout": 30,
        "is_host": "false",
    }
    plan = plan_for(
        "--cpu",
        "--num_processes",
        "2",
        "--rdzv_backend",
        "c10d",
        "--main_process_port",
        "1234",
        "--rdzv_conf",
        "timeout=5",
    )
    assert plan.rdzv_conf == {"timeout": 5} and plan.rdzv_backend == "c10d"


def test_fsdp_section_only_when_fsdp_is_used():
    config = AccelConfig(fsdp_config=FsdpConfig(fsdp_version=2))
    assert plan_for("--cpu", config=config).contract.fsdp_config == {}
    used = plan_for("--use_fsdp", "--num_processes", "2", config=config)
    assert json.loads(used.env[FSDP_CONFIG]) == {"fsdp_version": 2}


def test_more_processes_than_gpus_is_refused_before_anything_starts():
    with pytest.raises(LaunchArgumentError) as raised:
        plan_for("--num_processes", "2", env={"CUDA_VISIBLE_DEVICES": "0"})
    message = str(raised.value)
    assert "--num_processes" in message and "1 GPU(s)" in message
    assert "--gpu_ids" in message and "--cpu" in message


def test_gpu_ids_name_the_gpus_counted():
    with pytest.raises(LaunchArgumentError, match="--gpu_ids 0,1 selects 2 GPU"):
        plan_for("--num_processes", "3", "--gpu_ids", "0,1", env={"CUDA_VISIBLE_DEVICES": "0,1,2"})
    plan = plan_for("--num_processes", "2", "--gpu_ids", "0,1")
    assert plan.nproc_per_node == 2 and plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"


@pytest.mark.parametrize(
    "flags", [("--cpu", "--num_processes", "4"), ("--num_processes", "2", "--num_machines", "2")]
)
def test_gpu_count_allows_cpu_runs_and_counts_processes_per_machine(flags):
    extra = ("--main_process_ip", "127.0.0.1") if "--num_machines" in flags else ()
    plan = plan_for(*flags, *extra, env={"CUDA_VISIBLE_DEVICES": "0"})
    assert plan.nproc_per_node in (1, 4)


def test_workers_run_through_the_failure_recorder_only_under_the_elastic_agent():
    plan = plan_for("--cpu", "--num_processes", "2")
    recorded = plan.python_command(record_failures=True)
    assert recorded[2].endswith("_failure_recorder.py")
    assert recorded[3:] == [SCRIPT, "out", "--lr", "3"]
    assert plan.python_command()[1:] == ["-u", SCRIPT, "out", "--lr", "3"]


@pytest.mark.parametrize(
    ("sizes", "variables"),
    [
        (["--parallelism_config_tp_size", "4"], {"PARALLELISM_CONFIG_TP_SIZE": "4"}),
        (["--parallelism_config_dp_shard_size", "4"], {"PARALLELISM_CONFIG_DP_SHARD_SIZE": "4"}),
        (
            [
                "--parallelism_config_dp_replicate_size",
                "2",
                "--parallelism_config_dp_shard_size",
                "2",
            ],
            {"PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2"},
        ),
        (
            ["--parallelism-config-dp-shard-size", "-1", "--parallelism_config_tp_size", "2"],
            {"PARALLELISM_CONFIG_DP_SHARD_SIZE": "-1", "PARALLELISM_CONFIG_TP_SIZE": "2"},
        ),
    ],
)
def test_parallelism_flags_reach_the_workers_as_accelerates_variables(sizes, variables):
    plan = plan_for("--cpu", "--num_processes", "4", "--use_parallelism_config", *sizes)
    assert plan.env[USE_PARALLELISM_CONFIG] == "true"
    assert {k: v for k, v in plan.env.items() if k.startswith("PARALLELISM_CONFIG_")} == variables
    contract = LaunchContract.from_env(plan.env)
    assert contract.use_parallelism_config


def test_parallelism_sizes_alone_enable_the_mesh_and_plain_runs_have_none():
    plan = plan_for("--cpu", "--num_processes", "2", "--parallelism_config_tp_size", "2")
    assert LaunchContract.from_env(plan.env).use_parallelism_config
    plain = plan_for("--cpu", "--num_processes", "2")
    assert not LaunchContract.from_env(plain.env).use_parallelism_config
    assert not any(name.startswith("PARALLELISM_CONFIG_") for name in plain.env)


def test_parallelism_sizes_that_do_not_fit_are_refused_before_starting():
    with pytest.raises(LaunchArgumentError) as caught:
        plan_for("--cpu", "--num_processes", "4", "--parallelism_config_tp_size", "3")
    message = str(caught.value)
    assert "dp_replicate(1) * dp_shard(1) * cp(1) * sp(1) * tp(3) = 3 != WORLD_SIZE(4)" in message
    with pytest.raises(LaunchArgumentError, match="DDP"):
        plan_for(
            "--cpu",
            "--num_processes",
            "4",
            "--parallelism_config_dp_replicate_size",
            "2",
            "--parallelism_config_tp_size",
            "2",
        )


def test_parallelism_section_from_a_file_and_flags_over_it():
    config = read_config_file(DATA / "fsdp_seed.yaml").merged_with(
        AccelConfig.from_mapping({"parallelism_config": {"parallelism_config_dp_shard_size": 2}})
    )
    plan = plan_for("--cpu", "--parallelism_config_tp_size", "1", config=config)
    assert plan.env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2"
    assert plan.env["PARALLELISM_CONFIG_TP_SIZE"] == "1"


def test_fp8_flags_reach_the_contract_as_recipe_fields():
    plan = plan_for(
        "--cpu",
        "--mixed_precision",
        "fp8",
        "--fp8_backend",
        "ao",
        "--fp8-pad-inner-dim",
        "false",
        "--fp8_enable_fsdp_float8_all_gather",
        "true",
        "--fp8_format",
        "e4m3",
        "--fp8_override_linear_precision",
        "false,true,false",
        "--fp8_use_autocast_during_eval",
        "--fp8_margin",
        "1",
        "--fp8_opt_level",
        "o1",
    )
    contract = LaunchContract.from_env(plan.env)
    assert contract == plan.contract
    assert contract.mixed_precision == "fp8" and contract.fp8_backend == "AO"
    assert contract.fp8_config == {
        "pad_inner_dim": False,
        "enable_fsdp_float8_all_gather": True,
        "fp8_format": "E4M3",
        "override_linear_precision": [False, True, False],
        "use_autocast_during_eval": True,
        "margin": 1,
        "opt_level": "O1",
    }
    assert not any("fp8" in note for note in plan.notes)


def test_accelerates_fp8_config_section_is_read(tmp_path):
    path = tmp_path / "fp8.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\nmixed_precision: fp8\nnum_processes: 1\nuse_cpu: true\n"
        "fp8_config:\n  backend: TE\n  amax_history_length: 16\n"
        "  amax_compute_algorithm: max\n  optimization_level: O1\n  fp8_format: HYBRID\n"
    )
    plan = plan_for(config=read_config_file(path))
    assert plan.contract.fp8_backend == "TE"
    assert plan.contract.fp8_config == {
        "amax_history_len": 16,
        "amax_compute_algo": "max",
        "opt_level": "O1",
        "fp8_format": "HYBRID",
    }
    # A flag overrides the file's key.
    flagged = plan_for("--fp8_backend", "ao", config=read_config_file(path))
    assert flagged.contract.fp8_backend == "AO"


def test_fp8_settings_without_fp8_are_reported_and_bad_values_refused():
    plan = plan_for("--cpu", "--mixed_precision", "bf16", "--fp8_backend", "ao")
    assert plan.contract.fp8_backend is None and plan.contract.fp8_config == {}
    assert any("fp8_backend" in note and "--mixed_precision fp8" in note for note in plan.notes)
    with pytest.raises(ConfigError, match="fp8_override_linear_precision"):
        plan_for("--mixed_precision", "fp8", "--fp8_override_linear_precision", "true,false")


def test_collective_timeout_reaches_the_workers_from_the_flag_or_the_file():
    plan = plan_for("--cpu", "--num_processes", "2", "--collective_timeout", "7.5")
    assert plan.env["ACCEL_PROCESS_GROUP_TIMEOUT"] == "7.5"
    assert LaunchContract.from_env(plan.env).process_group_timeout == 7.5
    from_file = plan_for("--cpu", config=AccelConfig(collective_timeout=40))
    assert from_file.contract.process_group_timeout == 40.0
    assert "ACCEL_PROCESS_GROUP_TIMEOUT" not in plan_for("--cpu").env  # the default applies
    with pytest.raises(ConfigError, match="collective_timeout"):
        plan_for("--cpu", "--collective_timeout", "0")


def test_as_accelerate_asks_workers_for_the_alias_or_names_the_missing_package():
    """``--as-accelerate`` sets ACCEL_AS_ACCELERATE=1, or refuses when accel is not installed.

    accel-launch's own test venv holds no accel (the refusal); a full install has it (the flag).
    """
    if importlib.util.find_spec("accel") is None:
        with pytest.raises(LaunchArgumentError, match="pip install accel"):
            plan_for("--cpu", "--as-accelerate")
    else:
        assert plan_for("--cpu", "--as-accelerate").env[contract.AS_ACCELERATE] == "1"
    plain = plan_for("--cpu")
    assert contract.AS_ACCELERATE not in plain.env
    assert plain.env["ACCELERATE_USE_CPU"] == "True"
    assert plain.env["ACCELERATE_MIXED_PRECISION"] == "no"
