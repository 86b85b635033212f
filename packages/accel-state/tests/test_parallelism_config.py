"""ParallelismConfig: Accelerate's fields and checks, the -1 degree, the launcher variables, and
the mesh layout arithmetic (no process group needed)."""

import pytest

from accel_state import (
    DeepSpeedSequenceParallelConfig,
    EnvironmentConfigError,
    LaunchContract,
    ParallelismConfig,
    ParallelismConfigError,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)
from accel_state.device_mesh import ParallelMesh, activate, active_parallel_mesh


@pytest.fixture(autouse=True)
def clean(single_process_state):
    """No launcher variables, fresh state."""


def test_defaults_are_ones_and_the_default_backends():
    config = ParallelismConfig()
    assert (config.dp_replicate_size, config.dp_shard_size, config.tp_size) == (1, 1, 1)
    assert (config.cp_size, config.sp_size) == (1, 1)
    assert (config.cp_backend, config.sp_backend) == ("torch", "deepspeed")
    assert config.tp_handler is None and config.total_size == 1
    assert config.active_mesh_dims == [] and config.device_mesh is None


def test_dimension_names_follow_accelerate():
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2, cp_size=2)
    assert config.dp_dim_names == ["dp_replicate", "dp_shard"]
    assert config.non_dp_dim_names == ["tp", "cp"]
    assert config.dp_shard_cp_dim_names == ["dp_shard", "cp"]
    assert config.dp_cp_dim_names == ["dp_replicate", "dp_shard", "cp"]
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert config.mesh_layout() == (("dp_replicate", "dp_shard", "cp", "tp"), (2, 2, 2, 2))
    assert config._get_mesh() == config.mesh_layout()  # Accelerate's private name, tests use it
    assert (config.data_parallel_size, config.non_data_parallel_size) == (4, 4)
    assert isinstance(config.tp_handler, TorchTensorParallelConfig)
    assert isinstance(config.cp_handler, TorchContextParallelConfig)


def test_one_degree_may_take_the_leftover_processes():
    config = ParallelismConfig(dp_shard_size=-1, tp_size=2).resolve(8)
    assert config.dp_shard_size == 4 and config.total_size == 8
    with pytest.raises(ParallelismConfigError, match="dp_shard_size and tp_size are all -1"):
        ParallelismConfig(dp_shard_size=-1, tp_size=-1)
    with pytest.raises(ParallelismConfigError, match=r"multiply to 3, which does not divide"):
        ParallelismConfig(tp_size=3, dp_shard_size=-1).resolve(8)


def test_product_error_prints_every_factor():
    with pytest.raises(ParallelismConfigError) as caught:
        ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2).resolve(4)
    assert "dp_replicate(2) * dp_shard(2) * cp(1) * sp(1) * tp(2) = 8 != WORLD_SIZE(4)" in str(
        caught.value
    )


def test_ones_take_every_process_on_the_unset_dimension():
    assert ParallelismConfig().resolve(4).dp_replicate_size == 4  # DDP, as in Accelerate
    assert ParallelismConfig().resolve(4, unset_dimension="dp_shard").dp_shard_size == 4
    assert ParallelismConfig().resolve(1).total_size == 1


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"tp_size": 0}, ["tp_size=0 must be at least 1", "-1"]),
        ({"dp_shard_size": 2.5}, ["dp_shard_size=2.5 must be an integer"]),
        ({"cp_backend": "ring"}, ["cp_backend='ring'", "torch"]),
        ({"sp_backend": "megatron"}, ["sp_backend='megatron'", "deepspeed, accelerate"]),
        ({"cp_size": 2, "sp_size": 2}, ["mutually exclusive"]),
        ({"dp_replicate_size": 2, "tp_size": 2}, ["pure data parallelism (DDP)", "dp_shard_size"]),
        ({"tp_size": 2, "tp_handler": TorchContextParallelConfig()}, ["TorchTensorParallelConfig"]),
    ],
)
def test_invalid_settings_name_the_field_and_the_fix(kwargs, words):
    with pytest.raises(ParallelismConfigError) as caught:
        ParallelismConfig(**kwargs)
    for word in words:
        assert word in str(caught.value)


def test_ddp_with_tp_is_refused_once_a_minus_one_resolves():
    config = ParallelismConfig(dp_replicate_size=-1, tp_size=2)
    with pytest.raises(ParallelismConfigError, match="DDP"):
        config.resolve(4)


def test_unset_fields_read_accelerates_variables(monkeypatch):
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "4")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "false")
    config = ParallelismConfig(cp_size=1)
    assert (config.dp_shard_size, config.tp_size) == (2, 4)
    assert TorchContextParallelConfig().cp_comm_strategy == "alltoall"
    assert DeepSpeedSequenceParallelConfig().sp_seq_length_is_variable is False
    assert ParallelismConfig(tp_size=2).tp_size == 2  # an argument wins over the variable
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "ring")
    with pytest.raises(ParallelismConfigError, match="Invalid cp_comm_strategy: ring"):
        TorchContextParallelConfig()
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: other"):
        TorchContextParallelConfig(cp_comm_strategy="other")


def test_malformed_variable_is_named(monkeypatch):
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "two")
    with pytest.raises(EnvironmentConfigError, match="PARALLELISM_CONFIG_TP_SIZE='two'"):
        ParallelismConfig()


def test_launch_contract_carries_the_settings():
    environ = {
        "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
        "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
        "PARALLELISM_CONFIG_TP_SIZE": "2",
    }
    contract = LaunchContract.from_env(environ)
    assert contract.use_parallelism_config
    assert contract.parallelism_config == {"dp_shard_size": "2", "tp_size": "2"}
    again = contract.to_env()
    assert again["PARALLELISM_CONFIG_TP_SIZE"] == "2"
    assert LaunchContract.from_env(again) == contract
    with pytest.raises(EnvironmentConfigError, match="unknown keys"):
        LaunchContract(parallelism_config={"pp_size": "2"})


def test_mesh_coordinates_without_building():
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2)
    expected = {  # rank: (dp_replicate, dp_shard, tp), row-major as init_device_mesh lays them
        0: (0, 0, 0),
        1: (0, 0, 1),
        2: (0, 1, 0),
        5: (1, 0, 1),
        7: (1, 1, 1),
    }
    for rank, (replica, shard, tp) in expected.items():
        mesh = ParallelMesh(config, "cpu", world_size=8, rank=rank)
        assert (mesh.local_rank("dp_replicate"), mesh.local_rank("dp_shard")) == (replica, shard)
        assert mesh.local_rank("tp") == tp and mesh.local_rank("cp") == 0
        assert mesh.data_parallel_rank == replica * 2 + shard
        assert mesh.local_rank("dp_shard_cp") == shard
        assert mesh.size("dp") == 4 and mesh.size("dp_cp") == 4 and mesh.size("tp") == 2


def test_active_mesh_is_process_state_and_resets():
    mesh = ParallelMesh(ParallelismConfig(), "cpu")
    activate(mesh)
    assert active_parallel_mesh() is mesh
    from accel_state import reset_state

    reset_state()
    assert active_parallel_mesh() is None


def test_a_single_process_mesh_is_empty():
    config = ParallelismConfig()
    assert config.build_device_mesh("cpu") is None
    assert config.get_device_mesh() is None
    with pytest.raises(ParallelismConfigError, match="Mesh 'tp' is not available"):
        config.get_submesh("tp")
    with pytest.raises(ParallelismConfigError, match="built for 'cpu'"):
        config.get_device_mesh("cuda")
