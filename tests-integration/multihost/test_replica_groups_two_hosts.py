"""Replica groups on two test hosts: per-step fault tolerance across machines, and a cut link.

One replica group per host, each started by its own ``accel launch --ft_replicas 2
--ft_replica_id K --ft_lighthouse HOST:PORT``; the lighthouse (``torchft_lighthouse``) runs on
the first host. The hosts file maps each hostname to 127.0.1.1 (as Debian writes it), so what the
groups publish to one another must be the address of the interface that routes to the
lighthouse, not the hostname's. The worker is the everyday loop of the single-machine tests
(``tests-integration/ft/ft_everyday.py``): one record per optimizer step (committed or not, with
its samples and time) and each process's final state.

* Test A: the loop over two hosts ends with bit-equal replicas, each sample used by exactly one
  committed step.
* Test B: host 2's link is cut at the bridge mid-training (a network failure: nothing is killed),
  limited to 100 Mbit/s throughout; host 1 goes on alone, host 2 rejoins once the link is back
  (healing from host 1, after a relaunch by ``--max_restarts`` if its quorum timed out), and the
  job ends with exact coverage and bit-equal replicas. Host 1's committed steps per second before,
  during and after the cut, and the bytes per committed step that crossed the link, are printed
  (``-s``); nothing is asserted about times.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ROOT,
    Finished,
    accel,
    job_env,
    outputs,
    stop_process_tree,
    wait_all,
)
from test_hosts import TestHost, TestHosts

sys.path.insert(0, str(ROOT / "tests-integration" / "ft"))
from ft_checks import (
    WORKER,
    assert_each_epoch_used_once,
    assert_replicas_bit_equal,
    records,
)

LIGHTHOUSE_PORT = 29510
#: torchft's timeout of collectives, commit votes and healing copies: a step in flight when the
#: link goes down fails after this (host 1's survives it, host 2's too).
TIMEOUT_SEC = 10
#: How long a step waits for its quorum: host 2 cut off longer than this fails and is relaunched.
QUORUM_TIMEOUT_SEC = 40
#: The quorum timeout of the cut that outlasts it (host 2's group fails and is relaunched).
SHORT_QUORUM_TIMEOUT_SEC = 12
#: The lighthouse counts a silent group out after this (torchft's default).
HEARTBEAT_MS = 5000
#: The link rate of Test B.
RATE_MBIT = 100
#: Hang guard of one job (both launchers together).
JOB_LIMIT = 360
#: Test B waits for this many steps committed by both groups before it cuts the link.
STEPS_BEFORE_CUT = 100


def ft_env(quorum_timeout: int = QUORUM_TIMEOUT_SEC) -> dict[str, str]:
    """The launchers' environment (no interface chosen) with this test's torchft timeouts."""
    env = job_env()
    env.update(TORCHFT_TIMEOUT_SEC=str(TIMEOUT_SEC), TORCHFT_QUORUM_TIMEOUT_SEC=str(quorum_timeout))
    return env


def start_lighthouse(host: TestHost, log: Path) -> subprocess.Popen[str]:
    """``torchft_lighthouse`` on ``host``'s cluster address; a step commits with one group."""
    binary = Path(sys.executable).with_name("torchft_lighthouse")
    if not binary.exists():
        pytest.skip(f"torchft_lighthouse is not installed next to {sys.executable}")
    command = [str(binary), "--min_replicas", "1", "--bind", f"{host.address}:{LIGHTHOUSE_PORT}"]
    command += ["--heartbeat_timeout_ms", str(HEARTBEAT_MS)]
    with log.open("w") as output:
        return host.popen(command, env=ft_env(), stdout=output, stderr=subprocess.STDOUT)


def launch_group(
    hosts: TestHosts,
    replica: int,
    per_host: int,
    restarts: int,
    out: Path,
    worker_args: Sequence[str],
    log: Path,
    quorum_timeout: int = QUORUM_TIMEOUT_SEC,
) -> subprocess.Popen[str]:
    """``accel launch`` of replica group ``replica`` on host ``replica``, joining the lighthouse."""
    command = [accel(), "launch", "--cpu", "--num_processes", str(per_host)]
    command += ["--ft_replicas", "2", "--ft_replica_id", str(replica)]
    command += ["--ft_lighthouse", f"{hosts[0].address}:{LIGHTHOUSE_PORT}"]
    command += ["--max_restarts", str(restarts), str(WORKER), "--out", str(out), *worker_args]
    with log.open("w") as output:
        return hosts[replica].popen(
            command, env=ft_env(quorum_timeout), stdout=output, stderr=subprocess.STDOUT
        )


def assert_all_ended_well(finished: dict[str, Finished], lighthouse_log: Path) -> None:
    """Both launchers exited with 0 (else: their output and the lighthouse's)."""
    if any(end.returncode != 0 for end in finished.values()):
        pytest.fail(f"{outputs(finished)}\n=== lighthouse\n{lighthouse_log.read_text()[-3000:]}")


def test_everyday_loop_over_two_hosts_ends_bit_equal_with_each_sample_once(
    make_hosts: Any, tmp_path: Path
) -> None:
    """Two groups of 2 processes, one per host: every step commits with both; replicas agree."""
    hosts = make_hosts(2, "debian")
    out = tmp_path / "job"
    out.mkdir()
    lighthouse_log = tmp_path / "lighthouse.log"
    lighthouse = start_lighthouse(hosts[0], lighthouse_log)
    args = ["--epochs", "2", "--samples", "96", "--step_delay", "0"]
    try:
        started = time.monotonic()
        jobs = {}
        for replica, host in enumerate(hosts):
            log = tmp_path / f"{host.hostname}.log"
            jobs[host.hostname] = (host, launch_group(hosts, replica, 2, 0, out, args, log), log)
        finished = wait_all(jobs, started, JOB_LIMIT)
    finally:
        stop_process_tree(lighthouse)
    assert_all_ended_well(finished, lighthouse_log)
    assert_replicas_bit_equal(out, 2, 2)
    assert_each_epoch_used_once(out, range(2), 96)
    for replica in (0, 1):
        steps = records(out, replica)
        assert steps and all(r["committed"] and r["participants"] == 2 for r in steps), steps
    seconds = {name: round(end.seconds, 1) for name, end in finished.items()}
    print(f"\n[two hosts] {len(records(out, 0))} steps, both groups in each; wall {seconds} s")


def wait_for_steps(
    out: Path, launchers: dict[str, subprocess.Popen[str]], count: int, deadline: float
) -> None:
    """Wait until group 0 committed ``count`` steps with both groups (fail if a launcher ends)."""
    while time.monotonic() < deadline:
        together = [r for r in records(out, 0) if r["committed"] and r["participants"] == 2]
        if len(together) >= count:
            return
        ended = {name: p.returncode for name, p in launchers.items() if p.poll() is not None}
        if ended:
            pytest.fail(f"launchers ended before {count} steps together: {ended}")
        time.sleep(0.2)
    pytest.fail(f"group 0 did not commit {count} steps together with group 1 in time")


def rate(times: list[float], start: float, end: float) -> str:
    """``N steps in S s = R steps/s`` for the times in ``[start, end)``."""
    count = sum(start <= t < end for t in times)
    seconds = max(end - start, 1e-9)
    return f"{count} steps in {seconds:.1f} s = {count / seconds:.2f} steps/s"


@pytest.mark.parametrize(
    ("cut_sec", "quorum_timeout"),
    [(20, QUORUM_TIMEOUT_SEC), (30, SHORT_QUORUM_TIMEOUT_SEC)],
    ids=["host-2-waits-out-the-cut", "host-2-relaunched"],
)
def test_a_cut_link_host_one_goes_on_host_two_rejoins_and_heals(
    make_hosts: Any, tmp_path: Path, cut_sec: int, quorum_timeout: int
) -> None:
    """Host 2's link (100 Mbit/s) goes down mid-training for ``cut_sec``, then comes back.

    A cut shorter than the quorum timeout: host 2's group waits in its quorum and rejoins in the
    same processes. A longer one: its quorum fails, ``accel launch`` relaunches the group (maybe
    more than once), and the new processes heal from host 1 once the link is back.
    """
    hosts = make_hosts(2, "debian")
    host_one, host_two = hosts
    hosts.limit_rate(host_two, RATE_MBIT)
    out = tmp_path / "job"
    out.mkdir()
    lighthouse_log = tmp_path / "lighthouse.log"
    lighthouse = start_lighthouse(host_one, lighthouse_log)
    samples = 4000
    args = ["--epochs", "1", "--samples", str(samples), "--step_delay", "0.05"]
    args += ["--solo_delay", "0.25"]
    cut_at = mended_at = 0.0
    try:
        started = time.monotonic()
        logs = {host.hostname: tmp_path / f"{host.hostname}.log" for host in hosts}
        launchers = {
            name: launch_group(hosts, i, 1, 5, out, args, logs[name], quorum_timeout)
            for i, name in enumerate(logs)
        }
        jobs = {name: (hosts[i], launchers[name], logs[name]) for i, name in enumerate(logs)}
        try:
            wait_for_steps(out, launchers, 3, started + JOB_LIMIT / 2)
            bytes_from, steps_from = hosts.link_bytes(host_two), time.time()
            wait_for_steps(out, launchers, STEPS_BEFORE_CUT, started + JOB_LIMIT / 2)
            bytes_to = hosts.link_bytes(host_two)
            cut_at = time.time()
            hosts.cut(host_two)
            time.sleep(cut_sec)
        finally:
            hosts.mend(host_two)
            mended_at = time.time()
        finished = wait_all(jobs, started, JOB_LIMIT)
        total_bytes = hosts.link_bytes(host_two)
    finally:
        stop_process_tree(lighthouse)
    assert_all_ended_well(finished, lighthouse_log)
    one, two = records(out, 0), records(out, 1)
    assert {r["life"] for r in one} == {0}, "host 1's group was restarted"
    one_times = [r["time"] for r in one if r["committed"]]
    assert any(cut_at < t < mended_at for t in one_times), "host 1 committed nothing in the cut"
    assert any(r["committed"] and r["time"] > mended_at for r in two), "host 2 never rejoined"
    if cut_sec > quorum_timeout:
        assert len({r["life"] for r in two}) > 1, "host 2's group outlived its quorum timeout"
    assert_replicas_bit_equal(out, 2, 1)
    assert_each_epoch_used_once(out, range(1), samples)

    crossed = bytes_to - bytes_from
    together_steps = sum(steps_from <= t < cut_at for t in one_times)
    end = max(r["time"] for r in one)
    stall = max(b - a for a, b in itertools.pairwise(one_times))
    print(
        f"\n[cut link {cut_sec} s, quorum timeout {quorum_timeout} s, {RATE_MBIT} Mbit/s] "
        f"host 1's committed steps per second (longest pause {stall:.1f} s):"
    )
    print(f"  before the cut: {rate(one_times, min(one_times), cut_at)}")
    print(f"  during the cut: {rate(one_times, cut_at, mended_at)}")
    print(f"  after the cut:  {rate(one_times, mended_at, end + 1e-6)}")
    lives = sorted({r["life"] for r in two})
    rejoined = min(r["time"] for r in two if r["committed"] and r["time"] > mended_at)
    print(
        f"  host 2: lives {lives}, first committed step {rejoined - mended_at:.1f} s after the "
        f"link came back; {sum(r['committed'] for r in two)} committed steps in all"
    )
    print(
        f"  link bytes while both trained: {crossed.total} ({crossed.sent} sent, "
        f"{crossed.received} received by host 2) over {together_steps} committed steps = "
        f"{crossed.total / max(together_steps, 1):.0f} B/step"
    )
    print(
        f"  link bytes over the whole job: {total_bytes.total} for {len(one_times)} committed "
        f"steps = {total_bytes.total / max(len(one_times), 1):.0f} B/step"
    )
    print(f"  wall: { {name: round(end.seconds, 1) for name, end in finished.items()} } s")
