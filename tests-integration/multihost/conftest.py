"""Jobs on several test hosts (``scripts/test_hosts.py``): one ``accel launch`` per host.

Every host is a network namespace with its own hostname and hosts file, so the launchers meet
over a bridge at addresses that exist only inside the namespaces. Tests skip, with the reason,
where namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from test_hosts import (  # noqa: E402
    TestHost,
    TestHosts,
    job_env,
    stop_process_tree,
    unavailable_reason,
)

HERE = Path(__file__).parent
EVERYDAY = HERE / "everyday.py"
PORT = 29500


@dataclasses.dataclass
class Finished:
    """One launcher's end: its host, exit status, output and seconds from the job's start."""

    host: TestHost
    returncode: int
    output: str
    seconds: float


def accel() -> str:
    """The ``accel`` console script beside this interpreter."""
    script = Path(sys.executable).with_name("accel")
    if not script.exists():
        pytest.fail(f"the accel console script is not installed next to {sys.executable}")
    return str(script)


def launch_command(
    hosts: TestHosts,
    host: TestHost,
    per_host: int,
    backend: str,
    flags: Sequence[str] = (),
    machines: str | None = None,
) -> list[str]:
    """``accel launch`` for ``host`` in a job over ``hosts`` (machine 0 is the main machine)."""
    command = [accel(), "launch", "--cpu", "--num_machines", machines or str(len(hosts))]
    command += ["--num_processes", str(per_host * len(hosts))]
    command += ["--main_process_ip", hosts[0].address, "--main_process_port", str(PORT)]
    command += ["--rdzv_backend", backend]
    if backend == "static":
        command += ["--machine_rank", str(host.index)]
    return [*command, *flags]


def start(host: TestHost, command: Sequence[str], log: Path) -> subprocess.Popen[str]:
    """Start ``command`` inside ``host``, its output into ``log``."""
    with log.open("w") as output:
        return host.popen(command, env=job_env(), stdout=output, stderr=subprocess.STDOUT)


def wait_all(
    jobs: dict[str, tuple[TestHost, subprocess.Popen[str], Path]],
    started: float,
    timeout: float,
) -> dict[str, Finished]:
    """Wait for every job (a hang guard of ``timeout`` s in all); stop any left, by PID."""
    finished: dict[str, Finished] = {}
    deadline = started + timeout
    try:
        while len(finished) < len(jobs) and time.monotonic() < deadline:
            for name, (host, process, log) in jobs.items():
                if name not in finished and process.poll() is not None:
                    seconds = time.monotonic() - started
                    finished[name] = Finished(host, process.returncode, log.read_text(), seconds)
            time.sleep(0.2)
    finally:
        for name, (host, process, log) in jobs.items():
            if name not in finished:
                stop_process_tree(process)
                finished[name] = Finished(host, -9, log.read_text() + "\n[HUNG]", timeout)
    return finished


def run_job(
    hosts: TestHosts,
    script_args: Sequence[str],
    tmp_path: Path,
    backend: str = "static",
    per_host: int = 2,
    flags: Sequence[str] = (),
    on: Sequence[TestHost] | None = None,
    timeout: float = 600,
    tag: str = "job",
) -> dict[str, Finished]:
    """One launcher per host of ``on`` (default all) running ``everyday.py``; wait for all."""
    jobs = {}
    started = time.monotonic()
    for host in on if on is not None else list(hosts):
        command = launch_command(hosts, host, per_host, backend, flags)
        log = tmp_path / f"{tag}-{host.hostname}.log"
        jobs[host.hostname] = (host, start(host, [*command, *script_args], log), log)
    return wait_all(jobs, started, timeout)


def outputs(finished: dict[str, Finished]) -> str:
    """Every launcher's status and the tail of its output, for assertion messages."""
    return "\n".join(
        f"=== {name}: exit {end.returncode} after {end.seconds:.1f} s\n{end.output[-5000:]}"
        for name, end in finished.items()
    )


@pytest.fixture
def make_hosts() -> Iterator[object]:
    """``make_hosts(count, hosts_file)`` -> started :class:`TestHosts`, deleted after the test."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    made: list[TestHosts] = []

    def make(count: int, hosts_file: str = "unresolvable") -> TestHosts:
        hosts = TestHosts(count, hosts_file=hosts_file, prefix=f"accel-{os.getpid()}-{len(made)}")
        made.append(hosts)
        hosts.start()
        return hosts

    try:
        yield make
    finally:
        for hosts in made:
            hosts.stop()
