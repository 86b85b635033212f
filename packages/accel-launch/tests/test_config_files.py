from pathlib import Path

import pytest
from launch_helpers import DATA

from accel_launch.config import (
    AccelConfig,
    DynamoConfig,
    FsdpConfig,
    accelerate_config_file,
    cache_folder,
    default_config_file,
    load_config,
    locate_config_file,
    read_config_file,
    write_config_file,
)
from accel_launch.config.defaults import basic_config, write_basic_config
from accel_launch.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_seed_fsdp_config_parses_without_warnings():
    warnings: list[str] = []
    config = read_config_file(DATA / "fsdp_seed.yaml", warnings)
    assert warnings == []
    assert config.distributed_type == "FSDP"
    assert config.mixed_precision == "bf16"
    assert config.num_processes == 2 and config.num_machines == 1 and config.machine_rank == 0
    assert config.downcast_bf16 is False  # written as the string 'no'
    assert config.rdzv_backend == "static" and config.same_network is True
    assert config.use_cpu is False and config.debug is False
    fsdp = config.fsdp_config
    assert fsdp.fsdp_auto_wrap_policy == "TRANSFORMER_BASED_WRAP"
    assert fsdp.fsdp_backward_prefetch == "BACKWARD_PRE"  # old key fsdp_backward_prefetch_policy
    assert fsdp.fsdp_sharding_strategy == "FULL_SHARD"
    assert fsdp.fsdp_state_dict_type == "SHARDED_STATE_DICT"
    assert fsdp.fsdp_transformer_layer_cls_to_wrap == "BertLayer"
    assert fsdp.fsdp_cpu_ram_efficient_loading is True and fsdp.fsdp_offload_params is False
    assert fsdp.fsdp_sync_module_states is True and fsdp.fsdp_use_orig_params is True
    assert fsdp.fsdp_forward_prefetch is False


def test_deepspeed_and_dynamo_sections_and_legacy_keys(tmp_path):
    path = write(
        tmp_path,
        """
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
dynamo_backend: 'NO'
deepspeed_config:
  gradient_accumulation_steps: 4
  gradient_clipping: 1.0
  offload_optimizer_device: CPU
  offload_param_device: none
  zero3_init_flag: true
  zero_stage: 3
  deepspeed_multinode_launcher: standard
fsdp_config:
  fsdp_sharding_strategy: 2
megatron_lm_config: {}
num_processes: 8
""",
    )
    config = read_config_file(path)
    assert config.dynamo_config == DynamoConfig(dynamo_backend="NO")
    ds = config.deepspeed_config
    assert (ds.zero_stage, ds.offload_optimizer_device, ds.gradient_accumulation_steps) == (
        3,
        "cpu",
        4,
    )
    assert ds.gradient_clipping == 1.0 and ds.zero3_init_flag is True
    assert config.fsdp_config.fsdp_sharding_strategy == "SHARD_GRAD_OP"


def test_dynamo_config_section(tmp_path):
    path = write(
        tmp_path,
        "dynamo_config:\n  dynamo_backend: inductor\n  dynamo_mode: max-autotune\n"
        "  dynamo_use_fullgraph: true\n  dynamo_use_dynamic: false\n",
    )
    assert read_config_file(path).dynamo_config == DynamoConfig(
        "INDUCTOR", "max-autotune", True, False
    )


def test_unknown_keys_warn_naming_the_key(tmp_path):
    path = write(tmp_path, "num_procesess: 2\nfsdp_config:\n  fsdp_magic: 1\ntpu_name: my-pod\n")
    warnings: list[str] = []
    config = read_config_file(path, warnings)
    assert config == AccelConfig()
    text = "\n".join(warnings)
    assert "'num_procesess'" in text and str(path) in text
    assert "'fsdp_config.fsdp_magic'" in text
    assert "'tpu_name' is not supported" in text


@pytest.mark.parametrize(
    ("text", "key", "allowed"),
    [
        ("mixed_precision: fp32\n", "mixed_precision", "no, fp8, fp16, bf16"),
        ("distributed_type: MULTI_TPU\n", "distributed_type", "MULTI_GPU"),
        (
            "fsdp_config:\n  fsdp_sharding_strategy: HALF_SHARD\n",
            "fsdp_config.fsdp_sharding_strategy",
            "FULL_SHARD",
        ),
        ("deepspeed_config:\n  zero_stage: 5\n", "deepspeed_config.zero_stage", None),
        ("use_cpu: maybe\n", "use_cpu", "true, false"),
        ("num_processes: two\n", "num_processes", None),
        ("main_process_port: 70000\n", "main_process_port", None),
        ("rdzv_backend: etcd\n", "rdzv_backend", "static, c10d"),
        (
            "parallelism_config:\n  parallelism_config_tp_size: 0\n",
            "parallelism_config.parallelism_config_tp_size",
            None,
        ),
        (
            "parallelism_config:\n  parallelism_config_cp_comm_strategy: ring\n",
            "parallelism_config.parallelism_config_cp_comm_strategy",
            "allgather, alltoall",
        ),
    ],
)
def test_invalid_values_name_file_key_value_and_allowed(tmp_path, text, key, allowed):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        read_config_file(path)
    message = str(info.value)
    assert str(path) in message
    assert f"{key}=" in message
    value = text.strip().split(":")[-1].strip()
    assert value in message
    if allowed:
        assert allowed in message
    assert info.value.key == key and info.value.source == str(path)


def test_bad_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "num_processes: 2\nfsdp_config: [unclosed\n")
    with pytest.raises(ConfigError, match=r"not valid YAML.*line \d+") as info:
        read_config_file(path)
    assert str(path) in str(info.value)


def test_top_level_must_be_mapping_and_section_too(tmp_path):
    with pytest.raises(ConfigError, match="mapping"):
        read_config_file(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="fsdp_config"):
        read_config_file(write(tmp_path, "fsdp_config: 3\n"))


def test_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"does not exist.*accel config"):
        load_config(tmp_path / "nope.yaml")


def test_json_config(tmp_path):
    path = write(tmp_path, '{"num_processes": 3, "use_cpu": true}', "config.json")
    assert read_config_file(path).num_processes == 3


def test_round_trip(tmp_path):
    config = AccelConfig(
        distributed_type="FSDP", num_processes=4, fsdp_config=FsdpConfig(fsdp_offload_params=True)
    )
    path = write_config_file(config, tmp_path / "sub" / "c.yaml")
    assert read_config_file(path) == config
    assert "deepspeed_config" not in path.read_text()


def test_merge_prefers_override():
    base = AccelConfig(
        num_processes=4, mixed_precision="fp16", fsdp_config=FsdpConfig(fsdp_version=1)
    )
    over = AccelConfig(num_processes=2, fsdp_config=FsdpConfig(fsdp_offload_params=True))
    merged = base.merged_with(over)
    assert merged.num_processes == 2 and merged.mixed_precision == "fp16"
    assert merged.fsdp_config == FsdpConfig(fsdp_version=1, fsdp_offload_params=True)


def test_default_location_precedence(monkeypatch, tmp_path):
    env = {"HOME": str(tmp_path / "home")}
    monkeypatch.setenv("HOME", env["HOME"])
    assert cache_folder(environ=env) == tmp_path / "home/.cache/huggingface/accel"
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    assert default_config_file(env) == tmp_path / "xdg/huggingface/accel/default_config.yaml"
    env["HF_HOME"] = str(tmp_path / "hf")
    assert default_config_file(env) == tmp_path / "hf/accel/default_config.yaml"
    assert accelerate_config_file(env) == tmp_path / "hf/accelerate/default_config.yaml"
    env["ACCEL_CONFIG_FILE"] = str(tmp_path / "mine.yaml")
    assert default_config_file(env) == tmp_path / "mine.yaml"


def test_accelerate_config_is_used_when_ours_is_missing(tmp_path):
    env = {"HF_HOME": str(tmp_path)}
    assert locate_config_file(None, env).path is None
    theirs = tmp_path / "accelerate" / "default_config.yaml"
    theirs.parent.mkdir()
    theirs.write_text("num_processes: 3\n")
    location = locate_config_file(None, env)
    assert location.path == theirs and "Accelerate" in (location.note or "")
    config, _ = load_config(None, env)
    assert config.num_processes == 3
    ours = tmp_path / "accel" / "default_config.yaml"
    ours.parent.mkdir()
    ours.write_text("num_processes: 2\n")
    location = locate_config_file(None, env)
    assert location.path == ours and location.note is None
    assert locate_config_file(str(tmp_path / "x.yaml"), env).explicit


def test_basic_config_and_no_overwrite(tmp_path):
    assert basic_config(gpus=0).use_cpu is True
    gpu4 = basic_config("bf16", gpus=4)
    assert (gpu4.distributed_type, gpu4.num_processes, gpu4.mixed_precision) == (
        "MULTI_GPU",
        4,
        "bf16",
    )
    target = tmp_path / "c.yaml"
    assert write_basic_config("fp16", target) == target
    assert read_config_file(target).mixed_precision == "fp16"
    assert write_basic_config("no", target) is None
    assert read_config_file(target).mixed_precision == "fp16"


def test_parallelism_config_section_in_accelerates_keys(tmp_path):
    path = write(
        tmp_path,
        "distributed_type: FSDP\n"
        "parallelism_config:\n"
        "  parallelism_config_dp_replicate_size: 2\n"
        "  parallelism_config_dp_shard_size: -1\n"
        "  parallelism_config_tp_size: 2\n"
        "  parallelism_config_cp_comm_strategy: alltoall\n"
        "  parallelism_config_sp_seq_length_is_variable: true\n",
    )
    warnings: list[str] = []
    config = read_config_file(path, warnings)
    assert warnings == []
    assert config.parallelism_config.settings() == {
        "dp_replicate_size": 2,
        "dp_shard_size": -1,
        "tp_size": 2,
        "cp_comm_strategy": "alltoall",
        "sp_seq_length_is_variable": True,
    }
    write_config_file(config, tmp_path / "again.yaml")
    assert read_config_file(tmp_path / "again.yaml") == config


def test_write_basic_config_takes_save_location_by_keyword(tmp_path):
    target = tmp_path / "basic.yaml"
    assert write_basic_config(mixed_precision="bf16", save_location=target) == target
    assert "mixed_precision: bf16" in target.read_text()
    with pytest.raises(ConfigError, match="save_location"):
        write_basic_config(save_location=target, config_file=tmp_path / "other.yaml")
