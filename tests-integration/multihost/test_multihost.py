"""Several machines for real: launchers on test hosts with their own hostnames and addresses.

Nothing is set by hand: no ``GLOO_SOCKET_IFNAME``, hostnames that resolve nowhere or to 127.0.1.1.
The everyday loop (train, evaluate, save, resume in a fresh launch) must end bit-equal to the
same processes on one machine; a machine that never arrives, fails early, or is cut off mid-run
must end the others promptly with a message naming it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    EVERYDAY,
    Finished,
    accel,
    job_env,
    launch_command,
    outputs,
    run_job,
    start,
    wait_all,
)
from safetensors.torch import load_file

#: (hosts, rendezvous, hosts file) of the everyday runs: each rendezvous x hosts-file pair once,
#: and on 2 hosts as on 3 both rendezvous and both hosts files.
LAYOUTS = [
    (2, "static", "unresolvable"),
    (2, "c10d", "debian"),
    (3, "static", "debian"),
    (3, "c10d", "unresolvable"),
]
#: A short arrival wait for the failure tests (the default is 600 s).
ARRIVAL = 8


def everyday_twice(run, out: Path) -> list[dict[str, Finished]]:
    """Train and save one epoch, then resume in a fresh launch and finish the second."""
    out.mkdir(parents=True, exist_ok=True)
    first = run([str(EVERYDAY), str(out), "--stop_after_epoch", "1"], "first")
    second = run([str(EVERYDAY), str(out)], "second")
    return [first, second]


def results(out: Path) -> tuple[dict[str, torch.Tensor], list[dict[str, object]]]:
    weights = load_file(str(out / "final" / "model.safetensors"))
    lines = (out / "metrics.json").read_text().splitlines()
    return weights, [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def one_machine_results(tmp_path_factory):
    """The everyday loop with 4 and 6 processes on one host (computed on first use)."""
    cache: dict[int, tuple[dict[str, torch.Tensor], list[dict[str, object]]]] = {}

    def get(processes: int, make_hosts) -> tuple[dict[str, torch.Tensor], list[dict[str, object]]]:
        if processes not in cache:
            hosts = make_hosts(1)
            out = tmp_path_factory.mktemp(f"one_machine_{processes}")

            def run(args, tag):
                finished = run_job(
                    hosts, args, out.parent, "c10d", per_host=processes, tag=f"one-{tag}"
                )
                assert all(end.returncode == 0 for end in finished.values()), outputs(finished)
                return finished

            everyday_twice(run, out)
            cache[processes] = results(out)
        return cache[processes]

    return get


@pytest.mark.timeout(900)  # hang guard only
@pytest.mark.parametrize(("count", "backend", "hosts_file"), LAYOUTS)
def test_the_everyday_loop_on_test_hosts_ends_bit_equal_to_one_machine(
    count, backend, hosts_file, make_hosts, one_machine_results, tmp_path
):
    hosts = make_hosts(count, hosts_file)
    out = tmp_path / "out"
    # The last host is slow (a sleep in its steps): it changes no number, and the main process
    # must name its ranks in the slow-rank report (windows of 2 backward passes here: an epoch
    # is 6 to 8 steps, and a rank is named when slow in two windows in a row).
    slow = hosts[count - 1]
    hooks = ["--slow_host", slow.hostname, "--slow_seconds", "0.04"]
    flags = ["--env", "ACCEL_SLOW_RANK_INTERVAL=2"]

    def run(args, tag):
        finished = run_job(hosts, [*args, *hooks], tmp_path, backend, flags=flags, tag=tag)
        assert all(end.returncode == 0 for end in finished.values()), outputs(finished)
        return finished

    launches = everyday_twice(run, out)
    main_output = "".join(finished[hosts[0].hostname].output for finished in launches)
    reports = [line for line in main_output.splitlines() if "accel: slow ranks over" in line]
    assert reports, main_output[-5000:]
    print(f"MEASURED slow-rank report ({count} hosts): {reports[0]}")
    # Both of the slow host's ranks are named (a loaded machine may confirm one a window before
    # the other, in two reports), and no other rank ever is.
    slow_ranks = (2 * count - 2, 2 * count - 1)
    for rank in slow_ranks:
        named = f"rank {rank} on {slow.hostname} ({slow.address})"
        assert any(named in report for report in reports), reports
    for rank in range(2 * count - 2):
        assert not any(f"rank {rank} on" in report for report in reports), reports
    start_lines = [
        line
        for finished in launches
        for end in finished.values()
        for line in end.output.splitlines()
        if line.startswith("accel launch: starting")
    ]
    assert len(start_lines) == 2 * count
    for host in hosts:  # each launcher chose its own eth0, the interface on the cluster network
        assert any(f"network: eth0 ({host.address})" in line for line in start_lines), start_lines

    weights, metrics = results(out)
    reference_weights, reference_metrics = one_machine_results(2 * count, make_hosts)
    assert sorted(weights) == sorted(reference_weights)
    assert all(torch.equal(weights[name], reference_weights[name]) for name in weights)
    assert metrics == reference_metrics
    assert [line["world"] for line in metrics] == [2 * count, 2 * count]
    assert metrics[-1]["history"][-1]["evaluated"] == 37


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_a_machine_that_never_arrives_ends_the_main_machine_naming_it(
    backend, make_hosts, tmp_path
):
    hosts = make_hosts(2)
    key = "timeout" if backend == "static" else "join_timeout"
    flags = ["--rdzv_conf", f"{key}={ARRIVAL}"]
    finished = run_job(
        hosts, [str(EVERYDAY), str(tmp_path)], tmp_path, backend, flags=flags, on=[hosts[0]]
    )
    end = finished["node0"]
    print(f"MEASURED never-arrives {backend}: node0 ended after {end.seconds:.1f} s")
    assert end.returncode != 0, outputs(finished)
    assert end.seconds < ARRIVAL + 60, outputs(finished)  # the wait, start-up and exit
    text = end.output
    waited = re.search(
        rf"rendezvous at {hosts[0].address}:29500 failed after (\d+) s of waiting", text
    )
    assert waited is not None, text
    assert ARRIVAL <= int(waited.group(1)) < ARRIVAL + 60, text  # the wait it really made
    assert f"The wait allowed is {ARRIVAL} s" in text
    if backend == "static":
        assert "machine(s) 1 never arrived" in text, text
    else:
        assert "1 machine(s) arrived, 2 needed" in text, text
    assert f"--rdzv_conf {key}=SECONDS (default 600)" in text


@pytest.mark.timeout(300)
def test_a_machine_whose_main_machine_never_comes_says_which_address_it_could_not_reach(
    make_hosts, tmp_path
):
    hosts = make_hosts(2)
    flags = ["--rdzv_conf", f"timeout={ARRIVAL}"]
    finished = run_job(hosts, [str(EVERYDAY), str(tmp_path)], tmp_path, flags=flags, on=[hosts[1]])
    end = finished["node1"]
    print(f"MEASURED main-never-comes: node1 ended after {end.seconds:.1f} s")
    assert end.returncode != 0 and end.seconds < ARRIVAL + 60, outputs(finished)
    assert (
        f"machine 1 (node1) could not reach the rendezvous of machine 0 at "
        f"{hosts[0].address}:29500 within {ARRIVAL} s" in end.output
    ), end.output


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_a_machine_failing_before_the_group_forms_ends_the_others_at_once(
    backend, make_hosts, tmp_path
):
    hosts = make_hosts(2)
    args = [str(EVERYDAY), str(tmp_path), "--fail_on_host", "node1"]
    finished = run_job(hosts, args, tmp_path, backend)
    main, failed = finished["node0"], finished["node1"]
    print(
        f"MEASURED fails-early {backend}: node1 ended after {failed.seconds:.1f} s, "
        f"node0 after {main.seconds:.1f} s"
    )
    assert failed.returncode == 1 and "node1 fails before the process group forms" in failed.output
    assert main.returncode == 1, outputs(finished)
    # Not the 600 s start-up wait: the main machine's launcher read node1's failure at once.
    assert main.seconds < failed.seconds + 30, outputs(finished)
    assert "another machine's job failed, so this machine's workers were stopped" in main.output
    assert "node1" in main.output.split("another machine's job failed")[1]


def _wait_for_steps(out: Path, ranks: int, steps: int, jobs, timeout: float = 300) -> None:
    """Wait until every rank recorded ``steps`` optimizer steps (a hang guard, not a speed bound)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = []
        for rank in range(ranks):
            path = out / f"steps-{rank}"
            counts.append(len(path.read_text().splitlines()) if path.exists() else 0)
        if min(counts) >= steps:
            return
        for _, process, log in jobs.values():
            if process.poll() is not None:
                raise AssertionError(f"a launcher ended early:\n{log.read_text()[-5000:]}")
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not reach step {steps} within {timeout} s")


@pytest.mark.timeout(600)
def test_a_machine_cut_off_mid_training_is_named_with_its_ranks_and_host(make_hosts, tmp_path):
    hosts = make_hosts(2)
    out = tmp_path / "out"
    out.mkdir()
    collective_timeout = 45
    flags = ["--collective_timeout", str(collective_timeout)]
    args = [str(EVERYDAY), str(out), "--epochs", "50", "--step_delay", "0.05"]
    jobs = {}
    for host in hosts:
        command = launch_command(hosts, host, 2, "static", flags)
        log = tmp_path / f"{host.hostname}.log"
        jobs[host.hostname] = (host, start(host, [*command, *args], log), log)
    _wait_for_steps(out, 4, 5, jobs)
    cut_at = time.monotonic()
    hosts.cut(hosts[1])
    finished = wait_all({"node0": jobs["node0"]}, cut_at, timeout=collective_timeout + 120)
    # The cut-off machine ends by itself too (a hang guard, not a speed bound): its store
    # reads and writes block until TCP gives up, so they are bounded in time.
    finished.update(wait_all({"node1": jobs["node1"]}, cut_at, timeout=collective_timeout + 120))
    main = finished["node0"]
    assert finished["node1"].returncode not in (0, -9), outputs(finished)
    print(f"MEASURED cut: node1 (cut off) ended {finished['node1'].seconds:.1f} s after the cut")
    print(
        f"MEASURED cut: node0 ended {main.seconds:.1f} s after the cut ({collective_timeout} s timeout)"
    )
    assert main.returncode not in (0, -9), outputs(finished)
    assert main.seconds < collective_timeout + 30, outputs(finished)
    assert re.search(r"Silent: ranks 2, 3 on node1 \(198\.18\.0\.11\)", main.output), main.output
    assert "No process on node1 answered: that machine is lost" in main.output
    print("MEASURED cut report:", next(x for x in main.output.splitlines() if "Silent:" in x))


ELASTIC_SCRIPT = (
    Path(__file__).resolve().parents[2] / "packages/accel/tests/elastic_launch_script.py"
)
# Short rendezvous timings, generous store timeouts: a loaded 2-core machine stalls for seconds.
ELASTIC_RDZV = "last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=5,read_timeout=300"


def _elastic_constants() -> dict[str, int]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("elastic_launch_script", ELASTIC_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = ("SAMPLES", "BATCH", "SAVE_EVERY", "PAUSE_AT", "FIRST_WORLD")
    return {name: getattr(module, name) for name in names}


def _records(logs: Path) -> list[dict]:
    found = []
    for path in sorted(logs.glob("*.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines() if line]
    return found


#: How long a stalled machine stays stopped: past the rendezvous keep-alive limit of
#: ELASTIC_RDZV (keep_alive_interval x keep_alive_max_attempt = 10 s), so the others count it dead.
STALL_SECONDS = 15


def _stall_after_its_worker_fails(job: tuple[object, subprocess.Popen[str], Path]) -> float:
    """Stop a launcher (and its workers) for STALL_SECONDS once its worker failed and it rejoined.

    torch's agent rejoins the rendezvous as soon as it sees its worker fail; a second later it is
    a participant of the next round, and the others complete that round without hearing from it
    again: the moment a loaded machine stalls in. Returns when the stall began.
    """
    _, process, log = job
    deadline = time.monotonic() + 300
    while "failed (exitcode" not in log.read_text():
        assert process.poll() is None, f"the launcher ended early:\n{log.read_text()[-5000:]}"
        assert time.monotonic() < deadline, "its worker never failed after the cut"
        time.sleep(0.1)
    time.sleep(1.0)
    stalled_at = time.monotonic()
    os.killpg(process.pid, signal.SIGSTOP)
    try:
        time.sleep(STALL_SECONDS)
    finally:
        os.killpg(process.pid, signal.SIGCONT)
    return stalled_at


@pytest.mark.timeout(900)  # hang guard only
@pytest.mark.parametrize("survivor_stalls", [False, True], ids=["cut", "cut-and-stall"])
def test_an_elastic_job_goes_on_without_a_machine_whose_link_is_cut(
    make_hosts, tmp_path, survivor_stalls
):
    """node2's link is cut mid-epoch; node0 and node1 finish the epoch as a 2-machine job.

    With ``survivor_stalls``, node1 is also stopped for longer than the keep-alive limit right
    after it rejoined the rendezvous, as a machine under heavy load can stall: node0 starts its
    worker in a round node1 no longer counts for, and node1 waits for the next one. Both must
    end up in one round and finish (torch's agent restarts node0's worker for the waiting
    machine; that worker must still be waiting for its peer then, not have given up).
    """
    known = _elastic_constants()
    hosts = make_hosts(3)
    logs = tmp_path / "logs"
    logs.mkdir()
    flags = ["--max_restarts", "1", "--rdzv_conf", ELASTIC_RDZV, "--collective_timeout", "45"]
    jobs = {}
    for host in hosts:
        command = launch_command(hosts, host, 1, "c10d", flags, machines="2:3")
        command += ["--env", f"LAUNCHER={host.hostname}", str(ELASTIC_SCRIPT)]
        command += ["--project", str(tmp_path / "project"), "--logs", str(logs)]
        log = tmp_path / f"{host.hostname}.log"
        jobs[host.hostname] = (host, start(host, command, log), log)
    deadline = time.monotonic() + 600
    while len([r for r in _records(logs) if r["event"] == "paused"]) < known["FIRST_WORLD"]:
        for name, (_, process, log) in jobs.items():
            assert process.poll() is None, f"{name} ended early:\n{log.read_text()[-5000:]}"
        assert time.monotonic() < deadline, "the first round never reached the pause"
        time.sleep(0.2)
    hosts.cut(hosts[2])  # node2 never hosts the store: node0's launcher does
    cut_at = time.monotonic()
    (logs / "go").touch()
    survivors = {name: jobs[name] for name in ("node0", "node1")}
    if survivor_stalls:
        stalled_at = _stall_after_its_worker_fails(jobs["node1"])
        print(f"MEASURED elastic stall: node1 stopped {stalled_at - cut_at:.1f} s after the cut")
    finished = wait_all(survivors, cut_at, timeout=600)
    finished.update(wait_all({"node2": jobs["node2"]}, time.monotonic(), timeout=1))
    print(
        f"MEASURED elastic {'cut and stall' if survivor_stalls else 'cut'}: node0 and node1 "
        f"finished {finished['node0'].seconds:.1f} s and {finished['node1'].seconds:.1f} s "
        "after the cut"
    )
    assert finished["node0"].returncode == 0 and finished["node1"].returncode == 0, outputs(
        finished
    )
    records = _records(logs)
    restarted = [r for r in records if r["event"] == "start" and r["restart"] == 1]
    assert sorted(r["rank"] for r in restarted) == [0, 1]
    assert {r["world"] for r in restarted} == {2}
    assert {r["launcher"] for r in restarted} == {"node0", "node1"}
    assert {r["resumed_from"] for r in restarted} == {"checkpoint_0"}
    reference = next(r["order"] for r in records if r["event"] == "reference")
    steps = [r for r in records if r["event"] == "step"]
    first = [i for r in steps if r["restart"] == 0 for i in r["ids"]]
    batch, world = known["BATCH"], known["FIRST_WORLD"]
    assert first == reference[0][: known["PAUSE_AT"] * batch * world]
    saved = known["SAVE_EVERY"] * batch * world  # samples consumed at the checkpoint
    rest = [i for r in steps if r["restart"] == 1 and r["epoch"] == 0 for i in r["ids"]]
    assert rest == reference[0][saved:]
    assert sorted(first[:saved] + rest) == list(range(known["SAMPLES"]))  # none twice, none lost


ROUTE_PROBE = (
    "import sys; from accel_state.network import route_to; "
    "print(*(route_to(host).interface for host in sys.argv[1:]))"
)


@pytest.mark.timeout(120)
def test_the_interface_chosen_is_the_one_that_routes_to_the_main_machine(make_hosts):
    import sys

    hosts = make_hosts(2)
    node1 = hosts[1]
    # eth0 reaches node0's cluster address; eth1 (another network) reaches 198.19.1.0/24.
    probe = node1.run([sys.executable, "-c", ROUTE_PROBE, hosts[0].address, "198.19.1.7"])
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["eth0", "eth1"]


@pytest.mark.timeout(600)
def test_workers_started_by_torchrun_choose_the_interface_themselves(make_hosts, tmp_path):
    import sys

    hosts = make_hosts(2, "debian")
    report = Path(__file__).resolve().parents[1] / "scripts" / "report_state.py"
    jobs = {}
    for host in hosts:
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
        command += ["--node_rank", str(host.index), "--nproc_per_node", "2"]
        command += ["--master_addr", hosts[0].address, "--master_port", "29500", str(report)]
        log = tmp_path / f"{host.hostname}.log"
        jobs[host.hostname] = (host, start(host, command, log), log)
    finished = wait_all(jobs, time.monotonic(), timeout=400)
    assert all(end.returncode == 0 for end in finished.values()), outputs(finished)
    for end in finished.values():
        said = [line for line in end.output.splitlines() if line.startswith("accel: GLOO")]
        assert len(said) == 1, end.output  # once per machine, by local rank 0
        assert f"=eth0: eth0 ({end.host.address}), which routes to the main machine" in said[0]
        assert end.output.count("sum=6") == 2  # both local ranks in the 4-process reduce


@pytest.mark.timeout(600)
def test_kubeflow_pytorchjob_variables_per_host_form_one_job(make_hosts, tmp_path):
    """What the training operator sets per pod, and nothing else, on two hosts.

    PyTorchJob with ``nprocPerNode``: ``PET_*`` for a launcher in each pod (``accel launch``
    reads them as torchrun does); v1 without it: ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/
    ``RANK`` and ``python train.py`` per pod.
    """
    import sys

    hosts = make_hosts(2)
    report = Path(__file__).resolve().parents[1] / "scripts" / "report_state.py"
    for shape in ("pet", "v1"):
        jobs = {}
        for host in hosts:
            if shape == "pet":
                command = [accel(), "launch", "--cpu"]
                pod = {
                    "PET_NNODES": "2",
                    "PET_NPROC_PER_NODE": "2",
                    "PET_NODE_RANK": str(host.index),
                    "PET_MASTER_ADDR": hosts[0].address,
                    "PET_MASTER_PORT": "29500",
                }
            else:
                command = [sys.executable]
                pod = {
                    "MASTER_ADDR": hosts[0].address,
                    "MASTER_PORT": "29500",
                    "WORLD_SIZE": "2",
                    "RANK": str(host.index),
                }
            log = tmp_path / f"{shape}-{host.hostname}.log"
            env = {**job_env(), **pod}
            with log.open("w") as output:
                process = host.popen(
                    [*command, str(report)], env=env, stdout=output, stderr=subprocess.STDOUT
                )
            jobs[host.hostname] = (host, process, log)
        finished = wait_all(jobs, time.monotonic(), timeout=400)
        assert all(end.returncode == 0 for end in finished.values()), outputs(finished)
        text = "".join(end.output for end in finished.values())
        world, total = ("4", "6") if shape == "pet" else ("2", "1")
        states = re.findall(rf"STATE rank=(\d) num={world} type=MULTI_CPU .* sum={total}", text)
        assert len(states) == int(world), text[-4000:]
