"""``accel launch --ft_replicas N``: replica groups that train on while one fails and is relaunched.

The flags are checked without torchft. The jobs are real: a torchft lighthouse in the launcher,
one group launcher per replica group (each its own torch world over gloo), and a worker that
trains on torchft directly (``scripts/ft_replica_worker.py``) and SIGKILLs itself in replica 1.
"""

from __future__ import annotations

import itertools
import signal
import sys
import time
from pathlib import Path

import pytest
from launch_helpers import SCRIPTS, accel_cmd, alive, clean_env, run, start, wait_dead

from accel_launch.errors import LaunchArgumentError
from accel_launch.launch_args import build_launch_parser
from accel_launch.plan import ELASTIC, build_plan
from accel_launch.replica_plan import ReplicaGroups, lighthouse_host, lighthouse_url
from accel_launch.runners.elastic import _network_line
from accel_state.contract import FT_ADDRESS
from accel_state.network import interface_addresses
from accel_state.torch_compat import GATES, torch_version

WORKER = SCRIPTS / "ft_replica_worker.py"


def plan_for(*flags: str):
    args = build_launch_parser().parse_args([*flags, str(WORKER)])
    return build_plan(args, None, environ={})


def test_ft_replicas_runs_every_group_here_with_a_lighthouse_of_its_own() -> None:
    plan = plan_for("--cpu", "--ft_replicas", "3", "--ft_min_replicas", "2", "--num_processes", "1")
    assert plan.fault_tolerance == ReplicaGroups(3, 2, (0, 1, 2), None)
    assert plan.mode == ELASTIC  # each group gets a store, even of one process
    assert plan_for("--cpu", "--num_processes", "2").fault_tolerance is None


def test_ft_lighthouse_runs_one_group_that_joins_it() -> None:
    plan = plan_for("--cpu", "--ft_lighthouse", "10.0.0.1:29510", "--ft_replica_id", "2")
    assert plan.fault_tolerance == ReplicaGroups(3, 1, (2,), "http://10.0.0.1:29510")
    assert lighthouse_url("http://[::1]:29510/") == "http://[::1]:29510"


def _non_loopback_interface() -> tuple[str, str] | None:
    """One interface of this machine with an IPv4 address off loopback: (name, address)."""
    for name, addresses in sorted(interface_addresses().items()):
        for address in addresses:
            if "." in address and not address.startswith("127."):
                return name, address
    return None


def test_a_group_joining_a_lighthouse_elsewhere_publishes_the_address_that_routes_there() -> None:
    found = _non_loopback_interface()
    if found is None:
        pytest.skip("this machine has no IPv4 interface off loopback")
    interface, address = found
    flags = ("--cpu", "--num_processes", "2", "--ft_replica_id", "1", "--ft_replicas", "2")
    plan = plan_for(*flags, "--ft_lighthouse", f"{address}:29510")
    assert plan.env[FT_ADDRESS] == address
    assert plan.env["GLOO_SOCKET_IFNAME"] == interface  # as for a job on several machines
    said = _network_line(plan)  # the launcher's line says what the interface routes to
    assert f"network: {interface} ({address}), which routes to the lighthouse {address}" in said
    # The user's interface wins, and its address is the one published.
    args = build_launch_parser().parse_args(
        [*flags, "--ft_lighthouse", f"{address}:1", str(WORKER)]
    )
    chosen = build_plan(args, None, environ={"GLOO_SOCKET_IFNAME": "lo"})
    assert chosen.env[FT_ADDRESS] == "127.0.0.1" and "NCCL_SOCKET_IFNAME" not in chosen.env
    own = build_plan(args, None, environ={FT_ADDRESS: "10.9.9.9"})  # the user's address wins
    assert FT_ADDRESS not in own.env and own.env["GLOO_SOCKET_IFNAME"] == interface
    # All on this machine (loopback lighthouse, or --ft_replicas alone): torchft's own choice.
    local = plan_for(*flags, "--ft_lighthouse", "127.0.0.1:29510")
    assert FT_ADDRESS not in local.env and "GLOO_SOCKET_IFNAME" not in local.env
    assert FT_ADDRESS not in plan_for("--cpu", "--ft_replicas", "2").env
    assert lighthouse_host("http://[fd00::1]:29510/") == "fd00::1"


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--ft_replicas", "0"), "--ft_replicas 0 must be at least 1"),
        (("--ft_replicas", "2", "--ft_min_replicas", "3"), "--ft_min_replicas 3 must be between"),
        (("--ft_min_replicas", "2"), "--ft_min_replicas 2 needs --ft_replicas N"),
        (("--ft_replica_id", "1"), "--ft_replica_id 1 needs --ft_lighthouse HOST:PORT"),
        (("--ft_lighthouse", "h:29510"), "--ft_lighthouse h:29510 needs --ft_replica_id I"),
        (("--ft_lighthouse", "nohost", "--ft_replica_id", "0"), "is not HOST:PORT"),
        (
            ("--ft_lighthouse", "h:1", "--ft_replica_id", "4", "--ft_replicas", "2"),
            "--ft_replica_id 4 must be between 0 and --ft_replicas 2 - 1",
        ),
        (
            ("--ft_replicas", "2", "--num_machines", "2", "--main_process_ip", "10.0.0.1"),
            "run one\n`accel launch --ft_lighthouse",
        ),
    ],
)
def test_bad_ft_flags_are_refused_naming_the_flag_and_the_fix(flags, named) -> None:
    with pytest.raises(LaunchArgumentError) as error:
        plan_for("--cpu", "--num_processes", "2", *flags)
    assert named.replace("\n", " ") in str(error.value).replace("\n", " ")


def read_steps(folder: Path, replica: int) -> list[tuple[int, int, int, int, float]]:
    rows = (folder / f"steps-{replica}").read_text().split("\n")
    return [
        (int(a), int(b), int(c), int(d), float(e))
        for a, b, c, d, e in map(str.split, filter(None, rows))
    ]


def read_lives(folder: Path, replica: int) -> list[tuple[int, int]]:
    rows = (folder / f"pids-{replica}").read_text().split("\n")
    return [(int(life), int(pid)) for life, pid in map(str.split, filter(None, rows))]


def launch(folder: Path, *flags: str, steps: int = 40, kill_at: int = 8, wait_for_all: int = 1):
    command = accel_cmd("launch", "--cpu", "--num_processes", "1", *flags, str(WORKER), str(folder))
    return [*command, str(steps), str(kill_at), str(wait_for_all)]


@pytest.mark.timeout(400)
def test_a_killed_replica_group_is_relaunched_heals_and_the_other_never_restarts(tmp_path) -> None:
    pytest.importorskip("torchft", reason="needs torchft: pip install 'accel-launch[ft]'")
    command = launch(tmp_path, "--ft_replicas", "2", "--max_restarts", "1")
    result = run(command, timeout=300, env=clean_env(CUDA_VISIBLE_DEVICES=""))
    assert result.returncode == 0, result.stderr[-6000:]
    assert "fault tolerance: 2 of 2 replica group(s) of 1 process(es) here" in result.stderr
    assert (
        "replica group 1 failed (exit code 137); relaunching it (restart 1 of 1)" in result.stderr
    )
    survivor, relaunched = read_lives(tmp_path, 0), read_lives(tmp_path, 1)
    assert [life for life, _ in survivor] == [0]  # the other group was never restarted
    assert [life for life, _ in relaunched] == [0, 1] and relaunched[0][1] != relaunched[1][1]

    steps_0, steps_1 = read_steps(tmp_path, 0), read_steps(tmp_path, 1)
    first_life = [row for row in steps_1 if row[0] == 0]
    second_life = [row for row in steps_1 if row[0] == 1]
    assert all(row[1] < 8 for row in first_life)  # it died at its first step from 8 on
    died_at = max([8, *(row[1] + 1 for row in first_life)])
    # The relaunched group healed: it started at the step the survivor had reached (at least
    # the one it died in), not at 0. Relaunched within torchft's heartbeat timeout, it can
    # rejoin before the survivor has dropped it, and retry that very step with it.
    assert second_life[0][1] >= died_at, second_life[:3]
    assert second_life[0][1] == max(row[1] for row in steps_0 if row[1] <= second_life[0][1])
    # At most the step the other group died in went uncommitted (when they trained together);
    # any step the survivor took alone meanwhile was committed.
    uncommitted = {row[1] for row in steps_0 if row[2] == 0}
    assert len(uncommitted) <= 1 and all(step >= 8 for step in uncommitted), steps_0[:12]
    alone = [row for row in steps_0 if row[3] == 1 and died_at <= row[1] < second_life[0][1]]
    assert all(row[2] == 1 for row in alone), alone[:5]
    gaps = [later[4] - earlier[4] for earlier, later in itertools.pairwise(steps_0)]
    print(f"MEASURED longest pause of the surviving group: {max(gaps):.2f} s")
    assert max(gaps) < 5 + 30 + 2  # heartbeat + gloo timeouts + 2 s: a hang guard
    assert steps_0[-1][3] == 2 and steps_1[-1][3] == 2  # they ended training together

    import torch

    final_0, final_1 = (torch.load(tmp_path / f"final-{i}.pt") for i in (0, 1))
    assert final_0["step"] == final_1["step"] >= 40
    assert all(torch.equal(final_0["model"][k], final_1["model"][k]) for k in final_0["model"])


@pytest.mark.timeout(400)
def test_a_group_out_of_restarts_is_left_out_and_the_others_finish(tmp_path) -> None:
    pytest.importorskip("torchft", reason="needs torchft: pip install 'accel-launch[ft]'")
    command = launch(tmp_path, "--ft_replicas", "2", "--max_restarts", "0", wait_for_all=0)
    result = run(command, timeout=300, env=clean_env(CUDA_VISIBLE_DEVICES=""))
    assert result.returncode == 137, result.stderr[-6000:]  # the lost group's exit code
    assert (
        "replica group 1 failed (exit code 137) with no restarts left (--max_restarts 0); the "
        "other groups go on without it" in result.stderr
    )
    assert "replica group 0 finished" in result.stderr
    assert read_steps(tmp_path, 0)[-1][1] >= 39
    assert not (tmp_path / "final-1.pt").exists()


@pytest.mark.timeout(300)
def test_after_a_group_finished_the_job_a_failed_group_is_not_relaunched(tmp_path) -> None:
    """The relaunch sees the job-finished file; failing after the end, it ends the job with 0."""
    pytest.importorskip("torchft", reason="needs torchft: pip install 'accel-launch[ft]'")
    worker = SCRIPTS / "ft_end_of_job_worker.py"
    command = accel_cmd(
        "launch", "--cpu", "--num_processes", "1", "--ft_replicas", "2", "--max_restarts", "3"
    )
    result = run([*command, str(worker), str(tmp_path)], timeout=240, env=clean_env())
    assert result.returncode == 0, result.stderr[-6000:]
    assert "replica group 1 failed (exit code 1); relaunching it (restart 1 of 3)" in result.stderr
    assert "replica group 0 finished" in result.stderr
    assert (tmp_path / "seen-finished").read_text() == "replica group 0\n"
    assert (
        "replica group 1 failed (exit code 7) after replica group 0 had finished the job; not "
        "relaunched" in result.stderr
    )
    assert (tmp_path / "lives-1").read_text().split() == ["0", "1"]  # restarts were left
    assert (tmp_path / "lives-0").read_text().split() == ["0"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 75), (signal.SIGINT, 130)])
def test_a_signal_to_the_launcher_stops_every_group(tmp_path, sig, code) -> None:
    pytest.importorskip("torchft", reason="needs torchft: pip install 'accel-launch[ft]'")
    command = launch(tmp_path, "--ft_replicas", "2", steps=100000, kill_at=-1)
    process = start(command, clean_env(CUDA_VISIBLE_DEVICES=""))
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and not all(
            (tmp_path / f"steps-{replica}").exists() for replica in (0, 1)
        ):
            time.sleep(0.2)
        assert process.poll() is None, process.communicate()[1][-4000:]
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == code, stderr[-4000:]
    workers = [pid for replica in (0, 1) for _, pid in read_lives(tmp_path, replica)]
    assert wait_dead(workers, 10) == []
    assert not any(alive(pid) for pid in workers)


def test_the_lighthouse_publishes_the_address_it_is_bound_to() -> None:
    pytest.importorskip("torchft", reason="needs torchft: pip install 'accel-launch[ft]'")
    import urllib.request

    from accel_state.torchft_api import start_lighthouse

    lighthouse = start_lighthouse("127.0.0.1", 0, min_replicas=2)
    try:
        # torchft itself would publish this machine's hostname, which may resolve nowhere.
        assert lighthouse.address.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{lighthouse.address}/status", timeout=30) as page:
            status = page.read().decode()
        assert "need min_replicas 2" in status
    finally:
        lighthouse.shutdown()


def test_on_a_torch_older_than_torchft_needs_the_launcher_refuses_with_the_gate() -> None:
    gate = GATES["replica_groups"]
    if gate.available():
        pytest.skip(
            f"torch {torch_version()} has replica groups (the gate needs {gate.minimum}): the "
            "refusal runs on the torch_versions legs of torch 2.4 and 2.6"
        )
    result = run(
        accel_cmd("launch", "--cpu", "--ft_replicas", "2", str(WORKER)),
        timeout=120,
        env=clean_env(),
    )
    assert result.returncode == 1, result.stderr
    assert f"accel launch: error: {gate.message()}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.torch_feature("replica_groups")
def test_without_torchft_the_launcher_says_which_extra_to_install(tmp_path) -> None:
    code = (
        "import sys; sys.modules['torchft'] = None; "  # as if not installed
        "from accel_launch.cli import main; "
        f"sys.exit(main(['launch', '--cpu', '--ft_replicas', '2', {str(WORKER)!r}]))"
    )
    result = run([sys.executable, "-c", code], timeout=120, env=clean_env())
    assert result.returncode == 1, result.stderr
    assert (
        "accel launch: error: fault tolerance across replica groups needs torchft" in result.stderr
    )
    assert "pip install 'accel-launch[ft]'" in result.stderr
    assert "Traceback" not in result.stderr
