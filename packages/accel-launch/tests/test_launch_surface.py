"""Accelerate's launch surface: the launch helpers, the to-fsdp2 / tpu-config subcommands and the
``--env``, ``--enable_cpu_affinity``, ``--hostfile``, ``--dynamo_use_regional_compilation`` and
``--fsdp_activation_checkpointing_offload`` flags, through real launches on CPU."""

import json
import os
import sys

import pytest
import torch.multiprocessing as mp
import yaml
from launch_helpers import SCRIPTS, accel_cmd, clean_env, run

from accel_launch.affinity import get_cpu_distributed_information, numa_cores_for, numa_nodes
from accel_launch.commands.to_fsdp2 import convert_config_to_fsdp2
from accel_launch.environment import convert_dict_to_env_variables, purge_accelerate_environment
from accel_launch.errors import LaunchArgumentError
from accel_launch.launch_args import build_launch_parser
from accel_launch.launch_helpers import (
    PrepareForLaunch,
    prepare_multi_gpu_env,
    prepare_sagemager_args_inputs,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
)
from accel_launch.plan import build_plan

WORKER = str(SCRIPTS / "launch_surface_worker.py")


def records(folder):
    return {path.name: json.loads(path.read_text()) for path in sorted(folder.glob("rank*.json"))}


def expected_affinity(local_rank, local_world_size):
    allowed = os.sched_getaffinity(0)
    nodes = {n: [c for c in cores if c in allowed] for n, cores in numa_nodes().items()}
    nodes = {n: cores for n, cores in nodes.items() if cores}
    if not nodes:
        return sorted(allowed)
    return sorted(numa_cores_for(local_rank, local_world_size, nodes))


@pytest.fixture(scope="module")
def flagged_launch(tmp_path_factory):
    """One 2-process CPU launch with every new flag that reaches the workers."""
    out = tmp_path_factory.mktemp("flags")
    result = run(
        accel_cmd(
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            "--env",
            "GREETING=hello=world",
            "--env",
            "EMPTY=",
            "--enable_cpu_affinity",
            "--dynamo_use_regional_compilation",
            "--use_fsdp",
            "--fsdp_activation_checkpointing",
            "true",
            "--fsdp_activation_checkpointing_offload",
            "true",
            WORKER,
            str(out),
        ),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return records(out)


@pytest.mark.timeout(180)
def test_env_flag_reaches_every_worker(flagged_launch):
    assert sorted(flagged_launch) == ["rank0.json", "rank1.json"]
    for record in flagged_launch.values():
        assert record["env"]["GREETING"] == "hello=world"
        assert record["env"]["EMPTY"] == ""


@pytest.mark.timeout(180)
def test_enable_cpu_affinity_pins_each_worker_to_its_numa_share(flagged_launch):
    sets = {}
    for record in flagged_launch.values():
        assert record["env"]["ACCELERATE_CPU_AFFINITY"] == "1"
        expected = expected_affinity(record["local_rank"], 2)
        assert record["affinity"] == expected
        sets[record["local_rank"]] = set(record["affinity"])
    nodes = numa_nodes()
    allowed = os.sched_getaffinity(0)
    if len(nodes) == 1 and len(allowed & set(next(iter(nodes.values())))) >= 2:
        assert not sets[0] & sets[1], "two workers on one node should get disjoint cores"


@pytest.mark.timeout(180)
def test_regional_compilation_and_activation_offload_reach_the_contract(flagged_launch):
    for record in flagged_launch.values():
        assert record["regional_compilation"] is True
        assert record["fsdp_config"]["fsdp_activation_checkpointing_offload"] is True
        assert record["fsdp_config"]["fsdp_activation_checkpointing"] is True


@pytest.mark.timeout(120)
def test_hostfile_sets_the_process_count(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# one machine, two slots\nlocalhost slots=2\n")
    out = tmp_path / "out"
    out.mkdir()
    result = run(
        accel_cmd("launch", "--cpu", "--hostfile", str(hostfile), WORKER, str(out)), timeout=90
    )
    assert result.returncode == 0, result.stderr
    found = records(out)
    assert sorted(found) == ["rank0.json", "rank1.json"]
    assert {record["world_size"] for record in found.values()} == {2}


@pytest.mark.timeout(120)
def test_one_process_launch_passes_env_and_runs_through_the_affinity_wrapper(tmp_path):
    # One process on one node gets every core of it, so its affinity is only checked for sanity;
    # the 2-process launch above is where pinning shows (disjoint shares).
    result = run(
        accel_cmd("launch", "--cpu", "--enable_cpu_affinity", "--env", "GREETING=one", WORKER,
                  str(tmp_path)),
        timeout=90,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = records(tmp_path)["rank0.json"]
    assert record["env"]["GREETING"] == "one" and record["world_size"] == 1
    assert record["affinity"] == expected_affinity(0, 1)


def _plan(*argv):
    return build_plan(build_launch_parser().parse_args([*argv, WORKER]))


def test_bad_flag_values_are_refused_naming_the_flag(tmp_path):
    with pytest.raises(LaunchArgumentError, match="--env 'NOEQUALS'"):
        _plan("--cpu", "--env", "NOEQUALS")
    with pytest.raises(LaunchArgumentError, match="--fsdp_activation_checkpointing true"):
        _plan("--cpu", "--use_fsdp", "--fsdp_activation_checkpointing_offload", "true")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("nodeA slots=2\nnodeB slots=2\n")
    with pytest.raises(LaunchArgumentError, match="--num_machines 3"):
        _plan("--cpu", "--hostfile", str(hostfile), "--num_machines", "3")
    plan = _plan("--cpu", "--hostfile", str(hostfile), "--machine_rank", "1")
    assert (plan.num_machines, plan.num_processes, plan.machine_rank) == (2, 4, 1)
    assert plan.rdzv_endpoint.startswith("nodeA:")
    with pytest.raises(LaunchArgumentError, match="not listed in the hostfile"):
        _plan("--cpu", "--hostfile", str(hostfile))
    with pytest.raises(LaunchArgumentError, match="cannot be read"):
        _plan("--cpu", "--hostfile", str(tmp_path / "missing"))


def test_numa_cores_are_split_between_local_processes():
    nodes = {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    got = [numa_cores_for(rank, 4, nodes) for rank in range(4)]
    assert got == [[0, 1], [4, 5], [2, 3], [6, 7]]
    assert numa_cores_for(0, 1, nodes) == [0, 1, 2, 3]
    assert numa_cores_for(1, 2, nodes, gpu_node=0) == [0, 1, 2, 3]


def test_cpu_distributed_information_reads_mpi_variables_too():
    info = get_cpu_distributed_information(
        {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    )
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    assert get_cpu_distributed_information({}).world_size == 1


def test_convert_dict_to_env_variables_skips_unsafe_entries():
    lines = convert_dict_to_env_variables({"A": "1", "B": "x y", "C": "", "D": "<x", "E": "2"})
    assert lines == ["A=1\n", "E=2\n"]


def test_purge_accelerate_environment_restores_variables(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "4")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)

    @purge_accelerate_environment
    def leaky():
        os.environ["ACCELERATE_MIXED_PRECISION"] = "fp16"
        os.environ["ACCELERATE_USE_CPU"] = "true"
        del os.environ["ACCEL_GRADIENT_ACCUMULATION_STEPS"]
        return "done"

    assert leaky() == "done"
    assert os.environ["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert os.environ["ACCEL_GRADIENT_ACCUMULATION_STEPS"] == "4"
    assert "ACCELERATE_USE_CPU" not in os.environ

    @purge_accelerate_environment
    class Base:
        def test_sets(self):
            os.environ["ACCEL_DEBUG_MODE"] = "true"

    class Child(Base):
        def test_child_sets(self):
            os.environ["ACCELERATE_DEBUG_MODE"] = "true"

    monkeypatch.delenv("ACCEL_DEBUG_MODE", raising=False)
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    Base().test_sets()
    Child().test_child_sets()
    assert "ACCEL_DEBUG_MODE" not in os.environ
    assert "ACCELERATE_DEBUG_MODE" not in os.environ


def test_prepare_simple_launcher_cmd_env_gives_the_contract(monkeypatch):
    monkeypatch.setenv("HF_HOME", clean_env()["HF_HOME"])
    args = build_launch_parser().parse_args(["--cpu", "--mixed_precision", "bf16", WORKER, "x"])
    cmd, env = prepare_simple_launcher_cmd_env(args)
    assert cmd == [sys.executable, "-u", WORKER, "x"]
    assert env["ACCEL_MIXED_PRECISION"] == "bf16" and env["ACCEL_USE_CPU"] == "true"
    many = build_launch_parser().parse_args(["--cpu", "--num_processes", "2", WORKER])
    with pytest.raises(LaunchArgumentError, match="prepare_multi_gpu_env"):
        prepare_simple_launcher_cmd_env(many)


def test_prepare_tpu_and_sagemaker():
    args = build_launch_parser().parse_args(["--mixed_precision", "bf16", "--debug", WORKER])
    _, env = prepare_tpu(args, {})
    assert env["XLA_USE_BF16"] == "1" and env["ACCELERATE_DEBUG_MODE"] == "true"
    with pytest.raises(LaunchArgumentError, match="TPU pods"):
        prepare_tpu(args, {}, pod=True)
    with pytest.raises(LaunchArgumentError, match="SageMaker"):
        prepare_sagemager_args_inputs(None, args)


def _rank_job(out_dir):
    """One rank of a job started by PrepareForLaunch: all-reduce the ranks, record the result."""
    import torch
    import torch.distributed as dist

    from accel_state import PartialState

    state = PartialState()
    value = torch.tensor([float(state.process_index + 1)])
    dist.all_reduce(value)
    record = {
        "rank": state.process_index,
        "world": state.num_processes,
        "local": state.local_process_index,
        "sum": value.item(),
        "fork": os.environ.get("FORK_LAUNCHED"),
        "cpu": os.environ.get("ACCEL_USE_CPU"),
        "device": str(state.device),
    }
    with open(os.path.join(out_dir, f"rank{state.process_index}.json"), "w") as handle:
        json.dump(record, handle)
    dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_prepare_for_launch_runs_a_two_process_job_with_prepare_multi_gpu_env(
    tmp_path, monkeypatch
):
    for key, value in clean_env().items():
        monkeypatch.setenv(key, value)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    args = build_launch_parser().parse_args(["--cpu", "--num_processes", "2", WORKER])
    env = prepare_multi_gpu_env(args)
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == ("2", "1", 0)
    assert env["WORLD_SIZE"] == "2" and env["MASTER_PORT"] == args.master_port
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    mp.start_processes(
        PrepareForLaunch(_rank_job, distributed_type="MULTI_CPU"),
        args=(str(tmp_path),),
        nprocs=2,
        start_method="spawn",
    )
    found = records(tmp_path)
    assert sorted(found) == ["rank0.json", "rank1.json"]
    for rank, record in enumerate(found[f"rank{i}.json"] for i in range(2)):
        assert (record["rank"], record["local"], record["world"]) == (rank, rank, 2)
        assert record["sum"] == 3.0
        assert record["fork"] == "1" and record["cpu"] == "true"
        assert record["device"] == "cpu"


def _write(path, data):
    path.write_text(yaml.safe_dump(data))


@pytest.mark.timeout(120)
def test_to_fsdp2_converts_a_config_file(tmp_path):
    source = tmp_path / "fsdp1.yaml"
    _write(
        source,
        {
            "distributed_type": "FSDP",
            "num_processes": 2,
            "fsdp_config": {
                "fsdp_sharding_strategy": "SHARD_GRAD_OP",
                "fsdp_backward_prefetch": "BACKWARD_PRE",
                "fsdp_use_orig_params": True,
                "fsdp_sync_module_states": True,
                "fsdp_offload_params": False,
                "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            },
        },
    )
    target = tmp_path / "fsdp2.yaml"
    result = run(accel_cmd("to-fsdp2", "--config_file", str(source), "--output_file", str(target)))
    assert result.returncode == 0, result.stderr
    assert "dropped fsdp_backward_prefetch" in result.stderr
    converted = yaml.safe_load(target.read_text())
    assert converted["num_processes"] == 2
    assert converted["fsdp_config"] == {
        "fsdp_reshard_after_forward": False,
        "fsdp_offload_params": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_version": 2,
    }
    again = run(accel_cmd("to-fsdp2", "--config_file", str(source), "--output_file", str(target)))
    assert again.returncode == 2 and "--overwrite" in again.stderr
    # The converted file launches as FSDP2.
    plan = build_plan(
        build_launch_parser().parse_args(["--config_file", str(target), "--cpu", WORKER]),
        __import__("accel_launch.config.files", fromlist=["x"]).load_config(str(target))[0],
    )
    assert plan.contract.fsdp_config["fsdp_version"] == 2
    assert plan.contract.fsdp_config["fsdp_reshard_after_forward"] is False
    assert convert_config_to_fsdp2({"fsdp_config": {"fsdp_version": 2, "x": 1}}) == {
        "fsdp_config": {"fsdp_version": 2, "x": 1}
    }


@pytest.mark.timeout(120)
def test_tpu_config_prints_the_gcloud_command_and_needs_gcloud(tmp_path):
    config = tmp_path / "tpu.yaml"
    _write(config, {"tpu_name": "pod-a", "tpu_zone": "europe-west4-a", "commands": ["ls", "pwd"]})
    result = run(accel_cmd("tpu-config", "--config_file", str(config), "--use_alpha", "--debug"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "Running gcloud alpha compute tpus tpu-vm ssh pod-a --zone europe-west4-a "
        "--command 'cd /usr/share; ls; pwd' --worker all"
    )
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    no_gcloud = run(
        accel_cmd("tpu-config", "--config_file", str(config), "--command", "echo hi"),
        env=clean_env(PATH=str(empty_path)),
    )
    assert no_gcloud.returncode == 1
    assert "gcloud" in no_gcloud.stderr and "not on PATH" in no_gcloud.stderr
    missing = run(accel_cmd("tpu-config", "--tpu_name", "x", "--tpu_zone", "z", "--debug"))
    assert missing.returncode == 2 and "--command" in missing.stderr
