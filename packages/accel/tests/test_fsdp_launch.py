"""FSDP through the real launcher: ``accel launch --use_fsdp --fsdp_*`` and the seed FSDP YAML."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fsdp_workers
import pytest

# Hang guards only: on a loaded 2-core machine these multi-process jobs may take minutes.
pytestmark = pytest.mark.timeout(900)


TESTS = Path(__file__).resolve().parent
SCRIPT = TESTS / "fsdp_launch_script.py"

# The seed's FSDP config file with the GPU-only values replaced for a CPU run: use_cpu true,
# fp32 (exact comparison), this model's layer class instead of BertLayer.
SEED_YAML = textwrap.dedent(
    """
    compute_environment: LOCAL_MACHINE
    debug: false
    distributed_type: FSDP
    downcast_bf16: 'no'
    fsdp_config:
      fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
      fsdp_backward_prefetch_policy: BACKWARD_PRE
      fsdp_forward_prefetch: false
      fsdp_cpu_ram_efficient_loading: true
      fsdp_offload_params: false
      fsdp_sharding_strategy: FULL_SHARD
      fsdp_state_dict_type: SHARDED_STATE_DICT
      fsdp_sync_module_states: true
      fsdp_transformer_layer_cls_to_wrap: Block
      fsdp_use_orig_params: true
    machine_rank: 0
    main_training_function: main
    mixed_precision: 'no'
    num_machines: 1
    num_processes: 2
    rdzv_backend: static
    same_network: true
    tpu_env: []
    tpu_use_cluster: false
    tpu_use_sudo: false
    use_cpu: true
    """
)


def launch(arguments: list[str], output: Path, home: Path, processes: int = 2) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    env.update(OMP_NUM_THREADS="1", HF_HOME=str(home), CUDA_VISIBLE_DEVICES="")
    output.mkdir()
    command = [
        sys.executable,
        "-m",
        "accel_launch.cli",
        "launch",
        *arguments,
        str(SCRIPT),
        str(output),
    ]
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return [json.loads((output / f"rank{rank}.json").read_text()) for rank in range(processes)]


def check(reports: list[dict], version: int) -> None:
    for report in reports:
        assert report["type"] == "FSDP"
        assert report["fsdp_version"] == version
        assert report["layers"] == ["Block"]
        assert report["local"] * len(reports) == pytest.approx(report["total"], rel=0.02)
        assert report["losses"] == pytest.approx(report["reference"], rel=1e-5, abs=1e-5)
    assert report["reference"] == fsdp_workers.reference_losses(3, 8, 1e-2)


def test_launch_flags_run_fsdp1(tmp_path):
    flags = [
        "--use_fsdp",
        "--cpu",
        "--num_processes",
        "2",
        "--fsdp_version",
        "1",
        "--fsdp_auto_wrap_policy",
        "TRANSFORMER_BASED_WRAP",
        "--fsdp_transformer_layer_cls_to_wrap",
        "Block",
        "--fsdp_sharding_strategy",
        "FULL_SHARD",
        "--fsdp_state_dict_type",
        "SHARDED_STATE_DICT",
    ]
    check(launch(flags, tmp_path / "out", tmp_path), version=1)


def test_seed_fsdp_yaml_runs_fsdp2(tmp_path):
    config = tmp_path / "fsdp.yaml"
    config.write_text(SEED_YAML)
    check(launch(["--config_file", str(config)], tmp_path / "out", tmp_path), version=2)


def test_one_process_fsdp_launch_trains_in_a_group_of_one(tmp_path):
    # `accel launch --use_fsdp --num_processes 1` (as under Accelerate): the launcher's rendezvous
    # gives the lone process a process group of one, so FSDP shards over it instead of refusing.
    flags = ["--use_fsdp", "--cpu", "--num_processes", "1", "--fsdp_version", "2"]
    flags += ["--fsdp_transformer_layer_cls_to_wrap", "Block"]
    check(launch(flags, tmp_path / "out", tmp_path, processes=1), version=2)
