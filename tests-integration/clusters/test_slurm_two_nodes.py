"""SLURM across two machines: a two-node cluster on test hosts, one slurmd in each.

``scripts/test_hosts.py`` makes two hosts (network namespaces with their own hostnames, resolving
each other as a cluster's hosts do); ``scripts/slurm_cluster.py`` starts slurmctld in the head
node, a slurmd in each and munged beside them. Every command goes through the head node. The
training script is the fault-tolerance example through ``scripts/long_job.py`` on 4 processes,
2 per node. Shapes: Accelerate's SLURM example (``sbatch -N2 --ntasks-per-node=1`` whose step
runs ``accel launch --num_machines $SLURM_NNODES --machine_rank $SLURM_NODEID
--main_process_ip <head>``) and ``srun -N2 --ntasks-per-node=2 python train.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LONG_JOB = HERE.parent / "scripts" / "long_job.py"
JOB_TIMEOUT = 400
sys.path.insert(0, str(ROOT / "scripts"))

import slurm_cluster  # noqa: E402
from test_hosts import TestHosts, unavailable_reason  # noqa: E402

REASON = unavailable_reason() or (
    f"needs SLURM's daemons and commands: {', '.join(slurm_cluster.missing_commands())}"
    if slurm_cluster.missing_commands()
    else None
)
if REASON:
    pytest.skip(REASON, allow_module_level=True)

ACCEL_LAUNCH_STEP = (
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=2",
    # Accelerate's SLURM example: the head node's name from the allocation, one launcher per
    # node, each told its machine rank by SLURM.
    'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
    "srun bash -c '{accel} launch --cpu --num_machines $SLURM_NNODES --machine_rank "
    "$SLURM_NODEID --num_processes {processes} --main_process_ip '\"$head\"' --main_process_port 29500 "
    "{script} {args}'",
)
SRUN_PYTHON = (
    "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2",
    "srun {python} {script} --requeue_exit {args}",
)
SHAPES = {"accel_launch": ACCEL_LAUNCH_STEP, "srun_python": SRUN_PYTHON}
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


class TwoNodes:
    """The hosts, the cluster and the environment its commands run with."""

    def __init__(self, hosts: TestHosts, cluster: slurm_cluster.Cluster) -> None:
        from accel_state.testing.environ import without_launcher_variables

        self.hosts = hosts
        self.cluster = cluster
        self.env = {
            name: value
            for name, value in without_launcher_variables(os.environ).items()
            if not name.startswith("SLURM_")
        }
        self.env.update(SLURM_CONF=str(cluster.conf), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    def command(self, *args: str, timeout: float = 30) -> str:
        result = subprocess.run(
            self.cluster.command(args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert result.returncode == 0, f"{' '.join(args)}: {result.stderr}"
        return result.stdout

    def submit(self, folder: Path, shape: str, *script_args: str, processes: int = 4) -> str:
        header, step = SHAPES[shape]
        accel = Path(sys.executable).with_name("accel")
        args = " ".join(script_args)
        body = step.format(
            python=sys.executable, accel=accel, script=LONG_JOB, args=args, processes=processes
        )
        batch = folder / "job.sbatch"
        batch.write_text(
            "#!/bin/bash\n#SBATCH --job-name=train\n"
            f"{header}\n#SBATCH --output={folder}/slurm-%j.out\n#SBATCH --open-mode=append\n"
            f"#SBATCH --chdir={folder}\n{body}\n"
        )
        return self.command("sbatch", "--parsable", str(batch)).strip().split(";")[0]

    def fields(self, job_id: str) -> dict[str, str]:
        text = self.command("scontrol", "show", "job", "--oneliner", job_id)
        return dict(part.split("=", 1) for part in text.split() if "=" in part)

    def wait_finished(self, job_id: str, folder: Path) -> tuple[dict[str, str], float]:
        started = time.monotonic()
        while time.monotonic() < started + JOB_TIMEOUT:
            fields = self.fields(job_id)
            if fields["JobState"] in ENDED:
                return fields, time.monotonic() - started
            time.sleep(0.5)
        self.command("scancel", job_id)
        pytest.fail(f"job {job_id} did not end in {JOB_TIMEOUT} s:\n{output(folder)[-3000:]}")


def output(folder: Path) -> str:
    return "".join(path.read_text() for path in sorted(folder.glob("slurm-*.out")))


def weights(project: Path) -> dict[str, torch.Tensor]:
    return load_file(str(project / "final" / "model.safetensors"))


def bit_equal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    return sorted(first) == sorted(second) and all(torch.equal(first[k], second[k]) for k in first)


@contextlib.contextmanager
def started_two_nodes(root: Path) -> Iterator[TwoNodes]:
    """Two test hosts and a SLURM cluster over them (files in ``root``), stopped on exit."""
    hosts = TestHosts(2, hosts_file="resolvable", prefix=f"accel-{os.getpid()}-slurm")
    hosts.start()
    try:
        cluster = slurm_cluster.start_on_hosts(root, list(hosts))
        try:
            yield TwoNodes(hosts, cluster)
        finally:
            slurm_cluster.stop(cluster)
    finally:
        hosts.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    with started_two_nodes(tmp_path_factory.mktemp("slurm_two_nodes")) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def uninterrupted(two_nodes, tmp_path_factory) -> dict[str, torch.Tensor]:
    """Accelerate's SLURM example shape to the end on the two nodes: the reference weights."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    job_id = two_nodes.submit(folder, "accel_launch", "--project_dir", str(folder / "project"))
    fields, seconds = two_nodes.wait_finished(job_id, folder)
    log = output(folder)
    print(f"MEASURED slurm two nodes, accel launch per node: {seconds:.1f} s")
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    assert fields["NodeList"] == "node[0-1]", fields
    ranks = re.findall(r"WORLD rank (\d) of 4 \(MULTI_CPU\), restart_count 0", log)
    assert sorted(ranks) == ["0", "1", "2", "3"], log[-4000:]
    for address in ("198.18.0.10", "198.18.0.11"):
        assert f"network: eth0 ({address}), which routes to the main machine" in log, log[-4000:]
    assert "on machine 0 of 2" in log and "on machine 1 of 2" in log
    return weights(folder / "project")


@pytest.mark.timeout(2 * JOB_TIMEOUT)
def test_accelerates_slurm_example_shape_runs_one_job_over_two_nodes(uninterrupted):
    assert uninterrupted  # the fixture asserted the job; its weights are the reference


@pytest.mark.timeout(2 * JOB_TIMEOUT)
def test_srun_over_two_nodes_forms_one_job_equal_to_accel_launch(
    two_nodes, uninterrupted, tmp_path
):
    project = tmp_path / "project"
    job_id = two_nodes.submit(tmp_path, "srun_python", "--project_dir", str(project))
    fields, seconds = two_nodes.wait_finished(job_id, tmp_path)
    log = output(tmp_path)
    print(f"MEASURED slurm two nodes, srun python: {seconds:.1f} s")
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    ranks = re.findall(r"WORLD rank (\d) of 4 \(MULTI_CPU\), restart_count 0", log)
    assert sorted(ranks) == ["0", "1", "2", "3"], log[-4000:]
    # Each node's local rank 0 chose its interface from the route to the head node.
    assert log.count("=eth0: eth0 (") == 2, log[-4000:]
    assert bit_equal(weights(project), uninterrupted)


@pytest.mark.timeout(4 * JOB_TIMEOUT)
def test_preempting_the_two_node_job_saves_exits_75_requeues_and_ends_bit_equal(
    two_nodes, tmp_path
):
    # One process per node: with DDP on 3 or more ranks the first step after any resume sums
    # gradients in another order than an uninterrupted run (DDP rebuilds its buckets in the
    # gradients' ready order after its first step; a resumed run takes its first step in the
    # initial layout), so equality is exact on 2 ranks only (docs/long-jobs/restarts.md).
    reference = tmp_path / "reference"
    reference.mkdir()
    job_id = two_nodes.submit(
        reference, "accel_launch", "--project_dir", str(reference / "project"), processes=2
    )
    fields, _ = two_nodes.wait_finished(job_id, reference)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), output(reference)
    folder = tmp_path / "preempted"
    folder.mkdir()
    project = folder / "project"
    args = ("--step_delay", "0.3", "--project_dir", str(project))
    job_id = two_nodes.submit(folder, "accel_launch", *args, processes=2)
    first = project / "checkpoints" / "checkpoint_0"
    deadline = time.monotonic() + JOB_TIMEOUT
    while not first.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.exists(), f"training never reached its first checkpoint:\n{output(folder)}"
    two_nodes.command("scancel", "--signal=TERM", job_id)
    fields, seconds = two_nodes.wait_finished(job_id, folder)
    log = output(folder)
    print(f"MEASURED slurm two nodes, preempted and requeued: {seconds:.1f} s after the signal")
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    assert fields["Restarts"] == "1", log[-4000:]
    stopped = re.search(r"SIGTERM: saved after step (\d+)", log)
    assert stopped and 5 <= int(stopped.group(1)) < 24, log[-4000:]  # mid-training
    restarted = re.findall(r"WORLD rank (\d) of 2 \(MULTI_CPU\), restart_count 1", log)
    assert sorted(restarted) == ["0", "1"], log[-4000:]
    assert bit_equal(weights(project), weights(reference / "project"))


@pytest.mark.timeout(2 * JOB_TIMEOUT)
def test_a_node_lost_mid_job_is_named_by_slurm_and_by_accel(two_nodes, tmp_path):
    project = tmp_path / "project"
    args = ("--step_delay", "0.3", "--project_dir", str(project))
    header, step = SHAPES["accel_launch"]
    # No requeue: SLURM requeues a batch job whose node failed (JobRequeue=1). The collective
    # timeout is well under the time SLURM takes to mark the node down (SlurmdTimeout=30 plus
    # its ping interval, 60-75 s here): when SLURM is first, it cancels the step and kills the
    # ranks before they can report.
    lost_step = step.replace("--cpu", "--cpu --collective_timeout 20")
    SHAPES["lost"] = (f"{header}\n#SBATCH --no-requeue", lost_step)
    try:
        job_id = two_nodes.submit(tmp_path, "lost", *args)
    finally:
        del SHAPES["lost"]
    first = project / "checkpoints" / "checkpoint_0"
    deadline = time.monotonic() + JOB_TIMEOUT
    while not first.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.exists(), f"training never reached its first checkpoint:\n{output(tmp_path)}"
    node1 = two_nodes.hosts[1]
    slurm_cluster.stop_daemon(two_nodes.cluster, "slurmd-node1")
    two_nodes.hosts.cut(node1)
    fields, seconds = two_nodes.wait_finished(job_id, tmp_path)
    log = output(tmp_path)
    reason = fields.get("Reason", "")
    print(f"MEASURED slurm node lost: job {fields['JobState']} ({reason}) after {seconds:.1f} s")
    print("MEASURED accel said:", next((x for x in log.splitlines() if "Silent:" in x), "-"))
    assert fields["JobState"] in ("FAILED", "NODE_FAIL"), fields
    assert "Silent: ranks 2, 3 on node1 (198.18.0.11)" in log, log[-5000:]
