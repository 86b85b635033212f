"""Replica groups under SLURM: one group per node of a two-node job, the lighthouse on node 0.

The cluster is the two-node one of ``test_slurm_two_nodes.py`` (two test hosts, a slurmd in each,
every command through the head node). The batch script is the one of the fault-tolerance page's
"Under SLURM": it starts ``torchft_lighthouse`` on the first node of the allocation (where the
script runs) and ``srun`` runs one ``accel launch --ft_replicas $SLURM_NNODES --ft_replica_id
$SLURM_NODEID --ft_lighthouse <first node>:29510`` per node. The worker is the everyday loop of
``tests-integration/ft/ft_everyday.py`` (one record per optimizer step, each process's final
state), one process per group.

* The loop ends with exit 0, bit-equal replicas and each sample in exactly one committed step.
* Node 1's worker is SIGKILLed mid-training: its launcher relaunches the group
  (``--max_restarts``), which heals from node 0 and trains on to the same end.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from test_slurm_two_nodes import JOB_TIMEOUT, ROOT, TwoNodes, output, started_two_nodes

sys.path.insert(0, str(ROOT / "tests-integration" / "ft"))
from ft_checks import (
    WORKER,
    assert_each_epoch_used_once,
    assert_replicas_bit_equal,
    records,
)

LIGHTHOUSE_PORT = 29510
#: The batch script (as documented): the lighthouse on node 0, one replica group per node.
BATCH = """#!/bin/bash
#SBATCH --job-name=replicas
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --output={folder}/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --chdir={folder}
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
{lighthouse} --min_replicas 1 --bind 0.0.0.0:{port} > {folder}/lighthouse.log 2>&1 &
lighthouse=$!
trap 'kill $lighthouse' EXIT
srun bash -c '{accel} launch --cpu --num_processes 1 --ft_replicas $SLURM_NNODES \\
    --ft_replica_id $SLURM_NODEID --ft_lighthouse '"$head"':{port} --max_restarts {restarts} \\
    {worker} {args}'
"""


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodes]:
    """The two-node cluster of ``test_slurm_two_nodes.py`` (its own, for this module)."""
    with started_two_nodes(tmp_path_factory.mktemp("slurm_replica_groups")) as nodes:
        yield nodes


def submit(nodes: TwoNodes, folder: Path, restarts: int, worker_args: Sequence[str]) -> str:
    """Submit the batch script running ``ft_everyday.py`` with ``worker_args``; the job's id."""
    binary = Path(sys.executable).with_name("torchft_lighthouse")
    if not binary.exists():
        pytest.skip(f"torchft_lighthouse is not installed next to {sys.executable}")
    batch = folder / "replicas.sbatch"
    batch.write_text(
        BATCH.format(
            folder=folder,
            lighthouse=binary,
            port=LIGHTHOUSE_PORT,
            accel=Path(sys.executable).with_name("accel"),
            restarts=restarts,
            worker=WORKER,
            args=" ".join(["--out", str(folder / "out"), *worker_args]),
        )
    )
    return nodes.command("sbatch", "--parsable", str(batch)).strip().split(";")[0]


def run(nodes: TwoNodes, folder: Path, restarts: int, worker_args: Sequence[str]) -> str:
    """Run the job to its end, assert it completed with exit 0; its output."""
    (folder / "out").mkdir()
    job_id = submit(nodes, folder, restarts, worker_args)
    fields, seconds = nodes.wait_finished(job_id, folder)
    log = output(folder)
    lighthouse = folder / "lighthouse.log"
    said = lighthouse.read_text()[-3000:] if lighthouse.exists() else "(no lighthouse log)"
    print(f"\nMEASURED slurm replica groups ({folder.name}): job {seconds:.1f} s")
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), (
        f"{fields}\n{log[-6000:]}\n=== lighthouse\n{said}"
    )
    assert fields["NodeList"] == "node[0-1]", fields
    return log


@pytest.mark.timeout(2 * JOB_TIMEOUT)
def test_one_replica_group_per_node_ends_bit_equal_with_each_sample_once(
    two_nodes: TwoNodes, tmp_path: Path
) -> None:
    log = run(two_nodes, tmp_path, 0, ["--epochs", "2", "--samples", "96", "--step_delay", "0"])
    # Each node's group publishes the address that routes to the lighthouse on node 0.
    for address in ("198.18.0.10", "198.18.0.11"):
        said = f"network: eth0 ({address}), which routes to the lighthouse 198.18.0.10"
        assert said in log, log[-4000:]
    out = tmp_path / "out"
    assert_replicas_bit_equal(out, 2, 1)
    assert_each_epoch_used_once(out, range(2), 96)
    for replica in (0, 1):
        steps = records(out, replica)
        assert steps and all(r["committed"] and r["participants"] == 2 for r in steps), steps
    print(f"  {len(records(out, 0))} steps, both groups in each")


@pytest.mark.timeout(2 * JOB_TIMEOUT)
def test_a_killed_group_is_relaunched_on_its_node_and_heals_from_the_other(
    two_nodes: TwoNodes, tmp_path: Path
) -> None:
    samples = 800
    args = ["--epochs", "1", "--samples", str(samples), "--step_delay", "0.05"]
    # Killed early, and node 0's steps alone are slow (1 s): node 0 cannot finish the job before
    # node 1's relaunch joins, even on busy cores (a group relaunched after the job's end on
    # another launcher finds no group to heal from: docs/long-jobs/fault-tolerance.md).
    args += ["--solo_delay", "1.0", "--kill", "1:0:backward:5"]
    log = run(two_nodes, tmp_path, 2, args)
    assert "replica group 1 failed (" in log, log[-4000:]
    out = tmp_path / "out"
    one, two = records(out, 0), records(out, 1)
    assert {r["life"] for r in one} == {0}, "node 0's group was restarted"
    assert {r["life"] for r in two} == {0, 1}, sorted({r["life"] for r in two})
    relaunched = [r for r in two if r["life"] == 1 and r["committed"]]
    assert relaunched and relaunched[-1]["participants"] == 2, two[-5:]
    assert_replicas_bit_equal(out, 2, 1)
    assert_each_epoch_used_once(out, range(1), samples)
    alone = sum(r["committed"] and r["participants"] == 1 for r in one)
    print(
        f"  node 0: {len(one)} steps, {alone} without node 1; node 1's second life: "
        f"{len(relaunched)} committed steps"
    )
