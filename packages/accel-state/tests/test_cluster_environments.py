import pytest

from accel_state import (
    EnvironmentConfigError,
    LocalEnvironment,
    MPICHEnvironment,
    OpenMPIEnvironment,
    SlurmEnvironment,
    TorchElasticEnvironment,
    XLAEnvironment,
    detect_layout,
    resolve_cluster_environment,
)
from accel_state.cluster.slurm import first_host, tasks_per_node

TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29511",
}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "6",
    "SLURM_NODEID": "2",
    "SLURM_TASKS_PER_NODE": "2(x3)",
    "SLURM_JOB_NODELIST": "gpu[007-009]",
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NAME": "train",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "MASTER_ADDR": "node0",
}
MPICH = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}


def test_torchrun_variables():
    layout = TorchElasticEnvironment.layout(TORCHRUN)
    assert TorchElasticEnvironment.detect(TORCHRUN)
    assert (layout.rank, layout.local_rank, layout.world_size, layout.local_world_size) == (
        3,
        1,
        4,
        2,
    )
    assert (layout.node_rank, layout.num_nodes) == (1, 2)
    assert (layout.master_addr, layout.master_port) == ("10.0.0.1", 29511)
    assert layout.source == "torchelastic"


def test_torchrun_half_set_is_an_error_naming_the_missing_variable():
    with pytest.raises(EnvironmentConfigError, match="WORLD_SIZE is not set"):
        TorchElasticEnvironment.layout({"RANK": "0"})


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ({"RANK": "4"}, "rank=4 must be in [0, world_size=4)"),
        ({"RANK": "-1"}, "RANK='-1' must be >= 0"),
        ({"WORLD_SIZE": "four"}, "WORLD_SIZE='four' is not an integer"),
        ({"LOCAL_RANK": "2"}, "local_rank=2 must be in [0, local_world_size=2)"),
        ({"MASTER_PORT": "70000"}, "master_port=70000"),
        ({"LOCAL_WORLD_SIZE": "8"}, "local_world_size=8 must be in [1, world_size=4]"),
    ],
)
def test_torchrun_contradictions_and_malformed_values(override, fragment):
    with pytest.raises(EnvironmentConfigError) as raised:
        TorchElasticEnvironment.layout({**TORCHRUN, **override})
    assert fragment in str(raised.value)


def test_slurm_variables_and_main_address_from_node_list():
    assert SlurmEnvironment.detect(SLURM)
    layout = SlurmEnvironment.layout(SLURM)
    assert (layout.rank, layout.local_rank, layout.world_size, layout.local_world_size) == (
        5,
        1,
        6,
        2,
    )
    assert (layout.node_rank, layout.num_nodes) == (2, 3)
    assert layout.master_addr == "gpu007"
    assert layout.master_port == 15000 + 123456 % 20000


def test_slurm_master_addr_variable_wins_and_interactive_jobs_are_not_launches():
    assert SlurmEnvironment.layout({**SLURM, "MASTER_ADDR": "head"}).master_addr == "head"
    assert not SlurmEnvironment.detect({**SLURM, "SLURM_JOB_NAME": "bash"})


def test_slurm_inconsistent_task_counts():
    with pytest.raises(EnvironmentConfigError, match="add up to 4"):
        SlurmEnvironment.layout({**SLURM, "SLURM_TASKS_PER_NODE": "2(x2)"})
    with pytest.raises(EnvironmentConfigError, match="cannot be parsed"):
        SlurmEnvironment.layout({**SLURM, "SLURM_TASKS_PER_NODE": "two"})


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("node1", "node1"),
        ("node[003-005,9],other", "node003"),
        ("a1,b2", "a1"),
        ("rack[2-3]-gpu[01-04]", "rack2-gpu01"),
    ],
)
def test_first_host(nodelist, host):
    assert first_host(nodelist) == host


def test_first_host_rejects_garbage_and_task_counts_expand():
    with pytest.raises(EnvironmentConfigError):
        first_host("node[1-2")
    assert tasks_per_node("4(x2),2") == [4, 4, 2]


def test_open_mpi():
    assert OpenMPIEnvironment.detect(OPENMPI)
    layout = OpenMPIEnvironment.layout(OPENMPI)
    assert (
        layout.rank,
        layout.world_size,
        layout.local_rank,
        layout.node_rank,
        layout.num_nodes,
    ) == (
        2,
        4,
        0,
        1,
        2,
    )
    assert layout.master_addr == "node0"


def test_open_mpi_across_machines_needs_master_addr():
    environ = {key: value for key, value in OPENMPI.items() if key != "MASTER_ADDR"}
    with pytest.raises(EnvironmentConfigError, match="needs MASTER_ADDR"):
        OpenMPIEnvironment.layout(environ)


def test_open_mpi_uneven_machines():
    with pytest.raises(EnvironmentConfigError, match="not a multiple"):
        OpenMPIEnvironment.layout({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "3"})


def test_mpich_single_machine_defaults_to_loopback():
    assert MPICHEnvironment.detect(MPICH)
    layout = MPICHEnvironment.layout(MPICH)
    assert (layout.rank, layout.world_size, layout.local_rank, layout.master_addr) == (
        1,
        2,
        1,
        "127.0.0.1",
    )


def test_xla_without_torch_xla_is_a_clear_error(monkeypatch):
    import accel_state.cluster.xla as xla_module

    monkeypatch.setattr(xla_module, "torch_xla_available", lambda: False)
    assert XLAEnvironment.detect({"PJRT_DEVICE": "TPU"})
    with pytest.raises(EnvironmentConfigError, match="torch_xla is not installed"):
        XLAEnvironment.layout({"PJRT_DEVICE": "TPU"})


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, LocalEnvironment),
        (TORCHRUN, TorchElasticEnvironment),
        ({**SLURM, **TORCHRUN}, TorchElasticEnvironment),
        (SLURM, SlurmEnvironment),
        ({**OPENMPI, **SLURM}, SlurmEnvironment),
        (OPENMPI, OpenMPIEnvironment),
        (MPICH, MPICHEnvironment),
        ({"PJRT_DEVICE": "CPU"}, XLAEnvironment),
        ({**MPICH, "PJRT_DEVICE": "CPU"}, MPICHEnvironment),
    ],
)
def test_resolution_order(environ, expected):
    assert resolve_cluster_environment(environ) is expected


def test_resolver_reads_os_environ_by_default(monkeypatch):
    for name in list(TORCHRUN) + list(SLURM) + list(OPENMPI) + list(MPICH) + ["PJRT_DEVICE"]:
        monkeypatch.delenv(name, raising=False)
    assert detect_layout().world_size == 1
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    assert detect_layout().rank == 3
