"""DiLoCo across replica groups, through the real ``accel launch --ft_replicas``.

Every job trains ``ft_diloco.py`` (one ``LocalSGD(..., diloco=DiLoCoSettings(...))`` block) in
two replica groups on loopback over gloo. What each job must show: the groups end with bit-equal
parameters (the block ends with a sync of every fragment), the loss went down, and the rounds
whose sync committed trained every sample of every epoch exactly once, pooled over all
processes; with a SIGKILL mid-round, the killed group is relaunched, heals and trains again.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from test_replica_training import launch_flags, report
from test_replica_training import run_job as run_replica_job

HERE = Path(__file__).parent
WORKER = HERE / "ft_diloco.py"
SAMPLES = 96


def run_job(
    out: Path, env: dict[str, str], flags: list[str], *worker_args: str
) -> subprocess.CompletedProcess[str]:
    """Run the DiLoCo worker under ``flags`` to completion (hard limit ``JOB_LIMIT``)."""
    return run_replica_job(out, env, flags, *worker_args, worker=WORKER)


def rounds(out: Path, replica: int, rank: int = 0) -> list[dict[str, Any]]:
    """One process's round records, in order."""
    path = out / f"rounds-r{replica}-p{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_final_parameters_bit_equal(out: Path, replicas: int, processes: int) -> None:
    """Rank r of every group ends with the same parameters."""
    finals = {path.name: torch.load(path) for path in sorted(out.glob("final-*.pt"))}
    assert len(finals) == replicas * processes, sorted(finals)
    for rank in range(processes):
        reference = finals[f"final-r0-p{rank}.pt"]
        for replica in range(1, replicas):
            other = finals[f"final-r{replica}-p{rank}.pt"]
            assert reference.keys() == other.keys()
            for name, tensor in reference.items():
                assert torch.equal(tensor, other[name]), f"replica {replica} {name} differs"


def assert_each_sample_in_one_committed_round(out: Path, epochs: int) -> None:
    """Pooled over all processes, the committed rounds of each epoch trained each sample once."""
    trained: dict[int, list[int]] = {epoch: [] for epoch in range(epochs)}
    for path in out.glob("rounds-*.jsonl"):
        for record in map(json.loads, path.read_text().splitlines()):
            if record["committed"]:
                trained[record["epoch"]].extend(record["indices"])
    for epoch, indices in trained.items():
        assert sorted(indices) == list(range(SAMPLES)), f"epoch {epoch}: {sorted(indices)}"


def assert_loss_went_down(out: Path, replica: int = 0) -> None:
    """The loss over the training set after the job is below the loss before it."""
    loss = json.loads((out / f"loss-r{replica}-p0.json").read_text())
    assert loss["after"] < 0.8 * loss["before"], loss


def test_diloco_two_groups_train_every_sample_once_and_end_equal(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Two groups of two processes (DDP inside), DiLoCo syncing every 4 inner steps."""
    out = tmp_path / "job"
    result = run_job(out, env, launch_flags(2, 2, 0), "--epochs", "2", "--sync_every", "4")
    assert result.returncode == 0, report(result)
    assert_final_parameters_bit_equal(out, 2, 2)
    assert_each_sample_in_one_committed_round(out, 2)
    assert_loss_went_down(out)
    for replica in range(2):
        records = rounds(out, replica)
        assert all(r["committed"] and r["participants"] == 2 for r in records), records
        # 6 batches an epoch (4 processes, 4 samples each): a round of 4 inner steps, then
        # the epoch's last 2 batches, synced when the epoch's samples run out.
        assert len(records) == 2 * 2, records


@pytest.mark.parametrize(
    ("killed", "schedule"),
    [
        # Streaming DiLoCo (2 fragments, delay 1): group 1 dies in its 7th inner step.
        ("1:0:forward:6", ("--sync_every", "8", "--fragments", "2", "--delay", "1")),
        # Plain DiLoCo: group 0 (the first of the quorum) dies inside its 6th optimizer step.
        ("0:0:optimizer:5", ("--sync_every", "4")),
    ],
    ids=["streaming-kill-group-1", "plain-kill-group-0"],
)
def test_diloco_survives_a_kill_mid_round(
    tmp_path: Path, env: dict[str, str], killed: str, schedule: tuple[str, ...]
) -> None:
    """A group is SIGKILLed mid-round; it is relaunched, heals, and no sample is lost."""
    out = tmp_path / "job"
    victim = int(killed.split(":")[0])
    result = run_job(
        out,
        env,
        launch_flags(2, 1, 1),
        *("--epochs", "3", *schedule, "--solo_delay", "1.5", "--kill", killed),
    )
    assert result.returncode == 0, report(result)
    survivor, relaunched = rounds(out, 1 - victim), rounds(out, victim)
    assert len({r["pid"] for r in survivor}) == 1, "the surviving group was restarted"
    assert {r["life"] for r in relaunched} == {0, 1}
    # The round the kill interrupted failed in the survivor: its sync's quorum lost the victim,
    # or already held the relaunched group (a new member). When the relaunch comes back later,
    # the round its return changes fails too; how soon it comes back is not asserted.
    assert sum(not r["committed"] for r in survivor) >= 1, survivor
    # Whether the survivor also commits a round alone depends on how soon the relaunch comes
    # back (on a quiet machine it can rejoin before the survivor's next sync): not asserted.
    assert any(r["committed"] and r["life"] == 1 for r in relaunched), "never healed"
    assert_final_parameters_bit_equal(out, 2, 1)
    assert_each_sample_in_one_committed_round(out, 3)
    assert_loss_went_down(out, 1 - victim)
