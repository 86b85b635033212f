"""Per-step fault tolerance across replica groups, through the real ``accel launch --ft_replicas``.

Every job is the everyday loop (``ft_everyday.py``: train, evaluate, save_state each epoch,
resume) in replica groups on loopback over gloo, with SIGKILLs planned in a phase of a step.
What each job must show: the groups that were not killed run in one process throughout; the
killed group is relaunched and heals from a live one; at the end every replica holds bit-equal
model, optimizer and scheduler state; and over each epoch the committed steps used every
sample exactly once.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import SHORT_QUORUM_TIMEOUT_SEC, TIMEOUT_SEC
from ft_checks import WORKER, assert_replicas_bit_equal, finals
from ft_checks import assert_each_epoch_used_once as assert_epochs_used_once
from safetensors.torch import load_file

from accel_state.testing import find_free_port

HERE = Path(__file__).parent
SAMPLES = 96
#: The lighthouse counts a silent group out after this (accel's default).
HEARTBEAT_SEC = 5
#: A job's hard limit: a hang fails the test instead of stalling CI.
JOB_LIMIT = 420


def accel() -> str:
    """The ``accel`` console script beside this interpreter."""
    return str(Path(sys.executable).with_name("accel"))


def launch_flags(replicas: int, processes: int, restarts: int, *extra: str) -> list[str]:
    """``accel launch`` of the worker in ``replicas`` groups of ``processes``."""
    return [
        accel(),
        "launch",
        "--cpu",
        "--ft_replicas",
        str(replicas),
        "--num_processes",
        str(processes),
        "--max_restarts",
        str(restarts),
        *extra,
    ]


def run_job(
    out: Path, env: dict[str, str], flags: list[str], *worker_args: str, worker: Path = WORKER
) -> subprocess.CompletedProcess[str]:
    """Run ``worker`` under ``flags`` to completion (hard limit :data:`JOB_LIMIT`)."""
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [*flags, str(worker), "--out", str(out), *worker_args],
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_LIMIT,
        check=False,
        start_new_session=True,
    )


def records(out: Path, replica: int, rank: int = 0) -> list[dict[str, Any]]:
    """One process's step records, in order."""
    path = out / f"steps-r{replica}-p{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def lives(out: Path, replica: int, rank: int = 0) -> list[int]:
    """The PIDs a process of ``replica`` ran as, one per life."""
    seen: dict[int, int] = {}
    for record in records(out, replica, rank):
        seen.setdefault(record["life"], record["pid"])
    return [seen[life] for life in sorted(seen)]


def longest_stall(out: Path, replica: int) -> float:
    """Seconds of the longest pause between two steps of one life of ``replica``."""
    steps = records(out, replica)
    return max(
        later["time"] - earlier["time"]
        for earlier, later in itertools.pairwise(steps)
        if earlier["life"] == later["life"]
    )


def report(result: subprocess.CompletedProcess[str]) -> str:
    """The job's output for an assertion message (its end, where failures are)."""
    return f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"


def test_kills_in_every_phase_of_a_step_then_a_fresh_launch_resumes(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Replica 1 dies five times, ~3 steps after each rejoin; replica 0 never stops."""
    out = tmp_path / "job"
    phases = ["forward", "backward", "allreduce", "commit", "optimizer"]
    kills = [f"--kill=1:{life}:{phase}:3" for life, phase in enumerate(phases)]
    result = run_job(out, env, launch_flags(2, 1, len(phases)), "--epochs", "4", *kills)
    assert result.returncode == 0, report(result)
    assert len(lives(out, 0)) == 1, "the surviving group was restarted"
    assert len(lives(out, 1)) == len(phases) + 1, lives(out, 1)
    for life in range(1, len(phases) + 1):  # each relaunched life healed and committed
        assert any(r["committed"] and r["life"] == life for r in records(out, 1)), life
    survivor = records(out, 0)
    assert sum(not r["committed"] for r in survivor) >= 1, "no step of the survivor failed"
    assert longest_stall(out, 0) < HEARTBEAT_SEC + TIMEOUT_SEC + 2
    assert_replicas_bit_equal(out, 2, 1)
    assert_epochs_used_once(out, range(4), SAMPLES)
    evaluations = [
        json.loads(line) for line in (out / "evals-r0-p0.jsonl").read_text().splitlines()
    ]
    # Evaluation stays inside the group: its 40 samples in batches of 8, one loss per batch.
    assert [e["n"] for e in evaluations] == [5] * 4

    # A fresh launch resumes the whole job from the newest checkpoint, for one more epoch.
    for path in out.glob("steps-*.jsonl"):
        path.rename(path.with_suffix(".first"))
    steps_before = finals(out)["final-r0-p0.pt"]["committed_steps"]
    for path in out.glob("final-*.pt"):
        path.unlink()
    resumed = run_job(out, env, launch_flags(2, 1, 0), "--epochs", "5", "--resume")
    assert resumed.returncode == 0, report(resumed)
    assert {r["epoch"] for r in records(out, 0)} == {4}
    assert_replicas_bit_equal(out, 2, 1, steps_before_launch=steps_before)
    assert_epochs_used_once(out, range(4, 5), SAMPLES)


def test_accumulation_counts_committed_steps_through_a_kill(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """3 micro-batches per step: a failed step's micro-batches all come again."""
    out = tmp_path / "job"
    flags = launch_flags(2, 1, 1)
    worker_args = ("--samples", "192", "--accumulation", "3", "--kill=1:0:backward:2")
    result = run_job(out, env, flags, *worker_args)
    assert result.returncode == 0, report(result)
    assert len(lives(out, 0)) == 1 and len(lives(out, 1)) == 2
    assert_replicas_bit_equal(out, 2, 1)
    assert_epochs_used_once(out, range(2), samples=192)
    # Steps are whole accumulations: 3 micro-batches of 4 per group taking part.
    for record in records(out, 0):
        expected = min(12 * record["participants"], 192 - record["first"])  # the epoch's end
        assert record["count"] == expected, record


def test_three_groups_heal_through_killed_sources_targets_and_saves(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A healing group dies as its copy arrives, a heal source dies sending, a saver in save."""
    out = tmp_path / "job"
    kills = [
        "--kill=2:0:forward:3",  # group 2 dies; its relaunch heals from a live group ...
        "--kill=2:1:heal_target:0",  # ... and dies as the copy arrives; the next one heals
        "--kill=*:0:heal_source:4",  # the first group asked to send a copy dies sending it
        "--kill=*:*:save:0",  # the group writing the first checkpoint dies inside save_state
    ]
    result = run_job(out, env, launch_flags(3, 1, 4), "--epochs", "2", *kills)
    assert result.returncode == 0, report(result)
    claimed = sorted(path.name for path in out.glob("kill-*"))
    assert claimed == [f"kill-{n}-rank0" for n in range(4)], claimed
    # Four planned deaths; under load a group can also time out once in the turmoil (and is
    # relaunched): what must hold is below.
    # (A life that died healing wrote no step: count the launcher's relaunches.)
    relaunches = (result.stdout + result.stderr).count("relaunching it (restart")
    assert relaunches >= 4, [lives(out, replica) for replica in range(3)]
    assert_replicas_bit_equal(out, 3, 1)
    assert_epochs_used_once(out, range(2), SAMPLES)
    # The save cut short was written by another group, into the same folder; every
    # checkpoint is complete (a staging folder the killed writer left is all that may remain).
    output = result.stdout + result.stderr
    taken_over = re.findall(r"replica group \d writes checkpoint (\S+) itself", output)
    assert taken_over, report(result)
    folders = sorted((out / "project" / "checkpoints").iterdir())
    checkpoints = [folder for folder in folders if not folder.name.startswith(".")]
    assert all(".accel-tmp-" in f.name for f in folders if f.name.startswith(".")), folders
    assert {Path(folder) for folder in taken_over} <= set(checkpoints), (taken_over, folders)
    for folder in checkpoints:
        assert (folder / "model.safetensors").is_file(), sorted(folder.iterdir())


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_groups_of_two_processes_lose_a_whole_group(
    tmp_path: Path, env: dict[str, str], strategy: str
) -> None:
    """2 groups x 2 processes (DDP, or FSDP2 sharding inside each group): group 1 dies."""
    out = tmp_path / "job"
    extra = ("--use_fsdp", "--fsdp_version", "2") if strategy == "fsdp2" else ()
    flags = launch_flags(2, 2, 1, *extra)
    result = run_job(out, env, flags, "--kill=1:0:backward:3", "--kill_all_ranks")
    assert result.returncode == 0, report(result)
    for rank in range(2):
        assert len(lives(out, 0, rank)) == 1
        assert len(lives(out, 1, rank)) == 2
    assert_replicas_bit_equal(out, 2, 2)
    assert_epochs_used_once(out, range(2), SAMPLES)


#: The end of a job with a group down: (kill plan, worker options, samples). "ms" steps take
#: milliseconds (a lone survivor ends the epoch in a fraction of a second), "1s" steps a second.
END_OF_JOB_CASES = {
    # The case: group 1 killed at step 5 of a 40-step epoch, relaunched only after the
    # survivor finished (held until the launcher marks the job finished).
    "relaunched-after-the-end-ms": ("1:0:forward:5", ("--hold=1:1:finish",), 160),
    # Killed in the last step: the relaunch comes as the survivor takes that step alone.
    "killed-in-the-last-step-1s": ("1:0:forward:11", ("--step_delay", "1"), 96),
    # Killed in the last step; the relaunch starts as the survivor writes its final state.
    "killed-in-the-last-step-ms": ("1:0:forward:19", ("--hold=1:1:final",), 160),
    # The group writing the final checkpoint dies inside save_state: another group writes it.
    "saver-killed-in-the-final-save": ("0:0:save:0", (), 96),
}


@pytest.mark.parametrize("case", list(END_OF_JOB_CASES))
def test_a_job_that_ends_with_a_group_down_succeeds_with_every_sample_trained(
    tmp_path: Path, env: dict[str, str], case: str
) -> None:
    """The survivor finishes; a relaunch after (or at) the end exits 0; nothing is lost."""
    out = tmp_path / "job"
    kill, options, samples = END_OF_JOB_CASES[case]
    killed, saver_killed = int(kill[0]), "save" in kill
    worker_args = ["--epochs", "1", "--samples", str(samples), f"--kill={kill}"]
    if "1s" not in case:
        worker_args += ["--step_delay", "0.001", "--solo_delay", "0"]
    result = run_job(out, env, launch_flags(2, 1, 2), *worker_args, *options)
    output = result.stdout + result.stderr
    assert result.returncode == 0, report(result)
    survivor = 1 - killed
    assert len(lives(out, survivor)) == 1, "the surviving group was restarted"
    assert (out / "kill-0-rank0").exists(), "the planned kill did not happen"
    assert output.count("relaunching it (restart") == 1, report(result)
    assert_epochs_used_once(out, range(1), samples=samples)
    assert "ReplicaQuorumError" not in output, report(result)
    if "1s" in case and (out / f"final-r{killed}-p0.pt").exists():
        # The relaunch came in time to heal before the last step: it ends like the survivor.
        assert_replicas_bit_equal(out, 2, 1)
    else:  # It found the job finished: it trained nothing, wrote nothing, and says why.
        finished = f"replica group {killed} was relaunched after replica group {survivor} had"
        assert finished in output, report(result)
        assert len(lives(out, killed)) == 1, "a relaunch took a step after the job's last one"
        assert not (out / f"final-r{killed}-p0.pt").exists()
    checkpoint = out / "project" / "checkpoints" / "checkpoint_0"
    assert (checkpoint / "model.safetensors").is_file(), report(result)
    if saver_killed:  # the survivor wrote the checkpoint the saver died writing
        assert f"replica group {survivor} writes checkpoint {checkpoint} itself" in output
    saved = load_file(checkpoint / "model.safetensors")
    final = finals(out)[f"final-r{survivor}-p0.pt"]["model"]
    assert saved.keys() == final.keys() and all(torch.equal(saved[k], final[k]) for k in saved)


def test_groups_start_together_and_one_that_comes_after_the_end_trains_nothing(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A group 5 s late is waited for; one that starts only after the job ended exits 0.

    Millisecond steps: without the wait at the first step, the first group would train the
    epoch alone while the other starts, and a group starting after the end would train it
    again from scratch (and write the same checkpoint a second time).
    """
    env["TORCHFT_QUORUM_TIMEOUT_SEC"] = str(SHORT_QUORUM_TIMEOUT_SEC)
    fast = ("--epochs", "1", "--samples", "160", "--step_delay", "0.001", "--solo_delay", "0")
    late = tmp_path / "late"
    result = run_job(late, env, launch_flags(2, 1, 0), *fast, "--hold=1:0:5")
    assert result.returncode == 0, report(result)
    for replica in (0, 1):  # every step was taken by both groups: 20 steps of 2 x 4 samples
        assert [r["participants"] for r in records(late, replica)] == [2] * 20, replica
    assert_replicas_bit_equal(late, 2, 1)

    after = tmp_path / "after"
    result = run_job(after, env, launch_flags(2, 1, 0), *fast, "--hold=1:0:finish")
    output = result.stdout + result.stderr
    assert result.returncode == 0, report(result)
    # Group 0 waited the quorum timeout for group 1, then trained the epoch alone.
    assert "replica group 0 starts with 1 of 2 replica groups" in output, report(result)
    assert [r["participants"] for r in records(after, 0)] == [1] * 40
    assert "replica group 1 started after replica group 0 had finished the job" in output
    assert not (after / "steps-r1-p0.jsonl").read_text()
    assert_epochs_used_once(after, range(1), samples=160)
    checkpoints = sorted(p.name for p in (after / "project" / "checkpoints").iterdir())
    assert checkpoints == ["checkpoint_0"], checkpoints


def test_too_few_groups_commit_nothing_and_stop_with_a_message(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """``--ft_min_replicas 2`` with one group left: no step commits; the job ends, explained."""
    out = tmp_path / "job"
    env["TORCHFT_QUORUM_TIMEOUT_SEC"] = str(SHORT_QUORUM_TIMEOUT_SEC)
    flags = launch_flags(2, 1, 0, "--ft_min_replicas", "2")
    started = time.monotonic()
    result = run_job(out, env, flags, "--kill=1:0:forward:3")
    assert result.returncode != 0, report(result)
    assert time.monotonic() - started < JOB_LIMIT
    output = result.stdout + result.stderr
    assert "ReplicaQuorumError" in output and "min_replicas=2" in output, report(result)
    assert "no restarts left" in output
    survivor = records(out, 0)
    assert any(r["committed"] for r in survivor)  # both groups trained together first
    assert not survivor[-1]["committed"], "a step committed with one group of the two needed"
    assert not (out / "final-r0-p0.pt").exists()


def test_a_lost_lighthouse_ends_every_group_with_a_message(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Two launchers join a lighthouse of their own process; killing it ends both, explained."""
    env["TORCHFT_QUORUM_TIMEOUT_SEC"] = str(SHORT_QUORUM_TIMEOUT_SEC)
    code = (
        "import sys, time\n"
        "from accel_state.torchft_api import start_lighthouse\n"
        "lighthouse = start_lighthouse('127.0.0.1', 0, 1, heartbeat_timeout_ms=2000)\n"
        "print(lighthouse.address, flush=True)\n"
        "time.sleep(3600)\n"
    )
    keeper = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    groups: list[subprocess.Popen[bytes]] = []
    try:
        assert keeper.stdout is not None
        address = keeper.stdout.readline().strip().removeprefix("http://")
        out = tmp_path / "job"
        out.mkdir()
        for replica in range(2):
            flags = [
                accel(),
                "launch",
                "--cpu",
                "--num_processes",
                "1",
                "--ft_lighthouse",
                address,
                "--ft_replica_id",
                str(replica),
                "--ft_replicas",
                "2",
                "--main_process_port",
                str(find_free_port()),
            ]
            with (out / f"launcher-{replica}.log").open("w") as log:
                groups.append(
                    subprocess.Popen(
                        [*flags, str(WORKER), "--out", str(out), "--epochs", "50"],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            paths = [out / f"steps-r{replica}-p0.jsonl" for replica in range(2)]
            if all(p.exists() and len(p.read_text().splitlines()) >= 3 for p in paths):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the groups did not train 3 steps within 120 s")
        keeper.kill()
        killed_at = time.monotonic()
        for group in groups:
            group.wait(timeout=SHORT_QUORUM_TIMEOUT_SEC + 60)
        ended_after = time.monotonic() - killed_at
        outputs = [(out / f"launcher-{replica}.log").read_text() for replica in range(2)]
    finally:
        keeper.kill()
        for group in groups:
            if group.poll() is None:
                os.killpg(group.pid, signal.SIGKILL)
    for group, output in zip(groups, outputs, strict=True):
        assert group.returncode != 0, output[-4000:]
        assert "ReplicaQuorumError" in output and "lighthouse" in output, output[-4000:]
    assert ended_after < SHORT_QUORUM_TIMEOUT_SEC + 60
