"""Ray across two test hosts (``nox -s ray``): a real two-node Ray cluster runs the everyday loop.

``ray start --head`` runs in node0, ``ray start --address`` in node1 (each node with its own
temporary folder, as separate machines have); a ``TorchTrainer`` with 2 workers placed
``STRICT_SPREAD`` runs ``everyday.train_func``, and accel adopts the process group Ray formed
across the two hosts. The same loop under ``accel launch`` over the same two hosts (one process
each) ends with the same metrics and bit-equal weights, and ``accel launch`` resumes from the
checkpoint Ray saved after the first epoch to the same end. Ray's daemons are stopped by PID
(``TestHosts.terminate``: every process in each host's network namespace); ``ray stop`` would
match processes by name across the whole machine.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs ray[train]: run `nox -s ray`")
torch = pytest.importorskip("torch")
from conftest import EVERYDAY, HERE, job_env, outputs, run_job  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from test_hosts import TestHosts  # noqa: E402

RAY_PORT = 6379
RAY_TIMEOUT = 600
# Ray alone on the test network: no sign-in, no usage report, no dashboard.
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
}


def ray_env() -> dict[str, str]:
    return {**job_env(), **RAY_ENV}


def ray_command(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("ray")), *args]


def start_ray(hosts: TestHosts, folder: Path) -> str:
    """``ray start`` on every host (node0 the head); return the head's address.

    ``folder`` holds each node's temporary folder; keep its path short (Ray's unix sockets live
    under it, and their paths may not exceed 107 bytes).
    """
    head = hosts[0]
    address = f"{head.address}:{RAY_PORT}"
    common = ("--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats")
    for host in hosts:
        role = (
            ("--head", f"--port={RAY_PORT}", "--include-dashboard=false")
            if host is head
            else (f"--address={address}",)
        )
        temp = folder / host.hostname  # each machine's own /tmp/ray
        started = host.run(
            ray_command(
                "start", *role, f"--node-ip-address={host.address}", f"--temp-dir={temp}", *common
            ),
            env=ray_env(),
            timeout=180,
        )
        assert started.returncode == 0, f"{host.hostname}: {started.stdout}{started.stderr}"
    return address


def run_trainer(hosts: TestHosts, address: str, out: Path, storage: Path) -> dict:
    """The driver runs on the head node, as a user's would; return ``ray-result.json``."""
    driver = hosts[0].run(
        [sys.executable, str(HERE / "ray_trainer.py"), address, str(out), str(storage)],
        env={**ray_env(), "PYTHONUNBUFFERED": "1"},
        timeout=RAY_TIMEOUT,
    )
    assert driver.returncode == 0, driver.stdout[-4000:] + driver.stderr[-6000:]
    return json.loads((out / "ray-result.json").read_text())


def ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]


def history(out: Path) -> list[dict]:
    lines = (out / "metrics.json").read_text().splitlines()
    return [entry for line in lines for entry in json.loads(line)["history"]]


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "final" / "model.safetensors"))


def assert_bit_equal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    assert sorted(first) == sorted(second)
    unequal = [name for name in first if not torch.equal(first[name], second[name])]
    assert not unequal, f"tensors differ: {unequal}"


@pytest.mark.timeout(3 * RAY_TIMEOUT)
def test_ray_over_two_hosts_runs_one_worker_on_each_and_equals_accel_launch(make_hosts, tmp_path):
    hosts = make_hosts(2, "resolvable")
    under_ray = tmp_path / "under_ray"
    under_ray.mkdir()
    started = time.monotonic()
    temporary = Path(tempfile.mkdtemp(prefix="ray-"))
    try:
        address = start_ray(hosts, temporary)
        result = run_trainer(hosts, address, under_ray, tmp_path / "ray_results")
    finally:
        for host in hosts:
            hosts.terminate(host)
        shutil.rmtree(temporary, ignore_errors=True)
    print(f"MEASURED ray two hosts (cluster start and fit): {time.monotonic() - started:.1f} s")
    for host in hosts:  # nothing of Ray is left running
        assert [pid for pid in hosts.processes(host) if pid != host.holder_pid] == []

    where = ranks(under_ray)
    assert sorted(record["hostname"] for record in where) == ["node0", "node1"], where
    for rank, record in enumerate(where):
        assert record["process_index"] == rank and record["num_processes"] == 2
        assert record["distributed_type"] == "MULTI_CPU"
        # Ray names each worker's device; accel uses it.
        assert record["ACCELERATE_TORCH_DEVICE"] is not None
        assert record["device"] == record["ACCELERATE_TORCH_DEVICE"]
    ray_history = history(under_ray)
    assert [entry["evaluated"] for entry in ray_history] == [37, 37]  # padding dropped
    assert result["metrics"] == ray_history[-1]
    checkpoints = result["checkpoints"]
    assert [metrics["epoch"] for _, metrics in checkpoints] == [0, 1]

    launched = tmp_path / "launched"
    launched.mkdir()
    finished = run_job(hosts, [str(EVERYDAY), str(launched)], tmp_path, per_host=1)
    assert all(end.returncode == 0 for end in finished.values()), outputs(finished)
    assert sorted(record["hostname"] for record in ranks(launched)) == ["node0", "node1"]
    assert history(launched) == ray_history
    assert_bit_equal(weights(launched), weights(under_ray))

    # Ray's checkpoint of the first epoch, resumed by a fresh accel launch on the two hosts.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    first_epoch = checkpoints[0][0]
    finished = run_job(
        hosts,
        [str(EVERYDAY), str(resumed), "--resume_from", first_epoch],
        tmp_path,
        per_host=1,
        tag="resume",
    )
    assert all(end.returncode == 0 for end in finished.values()), outputs(finished)
    assert history(resumed) == ray_history[1:]
    assert_bit_equal(weights(resumed), weights(under_ray))
