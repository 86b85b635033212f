"""A one-node SLURM cluster on localhost for CI: ``munged``, ``slurmctld`` and ``slurmd``.

``python scripts/slurm_cluster.py DIR`` starts one, prints the variables that reach it
(``SLURM_CONF``), waits for Enter and stops it. ``nox -s slurm`` uses :func:`start` and
:func:`stop`. Every file (config, munge key and socket, state, logs, pid files) lives in DIR;
nothing under /etc is changed. The daemons run as the current user (root on CI machines) and
are stopped by PID.

The configuration is what preemption tests need, fast: process tracking by parent PID
(``proctrack/linuxproc``, no cgroups), no task plugin, ``RequeueExit=75`` (accel's exit status
after SIGTERM) so a job that exits 75 is requeued, step credentials that expire after 5 s
(a requeued job waits for its old credential to expire before it starts again; the default is
120 s) and a backfill pass every second.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DAEMONS = ("munged", "slurmctld", "slurmd")
#: Debian packages providing the daemons and the client commands.
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


class ClusterError(RuntimeError):
    """The cluster could not be started (the message names the log to read)."""


@dataclasses.dataclass
class Cluster:
    """A running cluster: its folder, config file and daemon PIDs (name -> pid)."""

    root: Path
    conf: Path
    pids: dict[str, int]
    #: What runs a client command where the controller is reachable (a test host's nsenter).
    prefix: tuple[str, ...] = ()

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` (``sbatch``, ``scontrol``...) run where it reaches the controller."""
        return [*self.prefix, *argv]

    @property
    def env(self) -> dict[str, str]:
        """Variables that point SLURM's commands at this cluster."""
        return {"SLURM_CONF": str(self.conf)}


def missing_commands() -> list[str]:
    """The daemons and commands this module needs that are not on ``PATH``."""
    needed = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "sinfo")
    return [name for name in needed if shutil.which(name) is None]


def install_with_apt(timeout: float = 600) -> None:
    """Install Debian's SLURM and munge packages with apt-get (needs root).

    Raises:
        ClusterError: apt-get is missing, this is not root, or the installation failed.
    """
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise ClusterError(
            f"SLURM is not installed and cannot be installed here (needs root and apt-get): "
            f"install {' '.join(PACKAGES)} by hand."
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        update = subprocess.run(
            ["apt-get", "update"], env=env, capture_output=True, timeout=timeout, check=False
        )
        if update.returncode == 0:
            result = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
    if result.returncode != 0:
        raise ClusterError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(
    root: Path, cpus: int = 2, nodes: Sequence[tuple[str, str]] = (("localhost", "127.0.0.1"),)
) -> Path:
    """Write ``slurm.conf`` under ``root``: ``nodes`` (name, address), the first the controller.

    Per-node files (spool, pid, log) carry the node's name (``%n``), so that several slurmd on
    one machine (test hosts) keep apart.
    """
    for folder in ("state", "spool", "log"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    several = len(nodes) > 1
    node_part = "-%n" if several else ""
    user = os.environ.get("USER") or "root"
    controller, controller_address = nodes[0]
    lines = {
        "ClusterName": "accel-ci",
        "SlurmctldHost": f"{controller}({controller_address})",
        "SlurmUser": user,
        "SlurmdUser": user,
        "SlurmctldPort": str(_free_port()),
        "SlurmdPort": str(_free_port()),
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "AuthInfo": f"socket={root / 'munge.socket'},cred_expire=5",
        "StateSaveLocation": str(root / "state"),
        "SlurmdSpoolDir": str(root / f"spool{node_part}"),
        "SlurmctldPidFile": str(root / "slurmctld.pid"),
        "SlurmdPidFile": str(root / f"slurmd{node_part}.pid"),
        "SlurmctldLogFile": str(root / "log" / "slurmctld.log"),
        "SlurmdLogFile": str(root / "log" / f"slurmd{node_part}.log"),
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "JobRequeue": "1",
        "RequeueExit": "75",
        "SchedulerType": "sched/backfill",
        "SchedulerParameters": "bf_interval=1",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_CPU",
        "ReturnToService": "2",
        "MpiDefault": "none",
        "JobCompType": "jobcomp/none",
        "AccountingStorageType": "accounting_storage/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "InactiveLimit": "0",
        "KillWait": "30",
        "MinJobAge": "300",
        "SlurmctldTimeout": "30",
        "SlurmdTimeout": "30",
    }
    text = "".join(f"{key}={value}\n" for key, value in lines.items())
    for name, address in nodes:
        text += f"NodeName={name} NodeAddr={address} CPUs={cpus} State=UNKNOWN\n"
    names = ",".join(name for name, _ in nodes)
    text += f"PartitionName=ci Nodes={names} Default=YES MaxTime=INFINITE State=UP\n"
    conf = root / "slurm.conf"
    conf.write_text(text)
    return conf


def _wait_for_file(path: Path, deadline: float, log: Path) -> None:
    while not (path.exists() and path.read_text().strip()):
        if time.monotonic() > deadline:
            tail = log.read_text()[-2000:] if log.exists() else "(no log)"
            raise ClusterError(f"{path.name} did not appear; {log}:\n{tail}")
        time.sleep(0.1)


def _run_daemon(command: list[str], pid_file: Path, log: Path, env: dict[str, str]) -> int:
    """Start a daemon that forks, and return its PID from its pid file."""
    pid_file.unlink(missing_ok=True)
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=START_TIMEOUT, check=False
    )
    if result.returncode != 0:
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise ClusterError(f"{' '.join(command)} failed: {result.stderr}\n{log}:\n{tail}")
    _wait_for_file(pid_file, time.monotonic() + START_TIMEOUT, log)
    return int(pid_file.read_text().split()[0])


def _start_munged(root: Path, env: dict[str, str]) -> int:
    """Start munged with a fresh key, its socket, pid and log files in ``root``; its PID."""
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    return _run_daemon(
        [
            "munged",
            "--force",
            f"--key-file={key}",
            f"--socket={root / 'munge.socket'}",
            f"--pid-file={root / 'munged.pid'}",
            f"--log-file={root / 'log' / 'munged.log'}",
            f"--seed-file={root / 'munged.seed'}",
        ],
        root / "munged.pid",
        root / "log" / "munged.log",
        env,
    )


def start(root: Path, cpus: int = 2) -> Cluster:
    """Start munged, slurmctld and slurmd on localhost; return once the node is idle.

    On failure every daemon already started is stopped before the error is raised.

    Raises:
        ClusterError: A daemon did not start or the node did not come up (the log is quoted).
    """
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    conf = write_config(root, cpus)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = Cluster(root=root, conf=conf, pids={})
    try:
        cluster.pids["munged"] = _start_munged(root, env)
        cluster.pids["slurmctld"] = _run_daemon(
            ["slurmctld", "-f", str(conf)],
            root / "slurmctld.pid",
            root / "log" / "slurmctld.log",
            env,
        )
        cluster.pids["slurmd"] = _run_daemon(
            ["slurmd", "-f", str(conf), "-N", "localhost"],
            root / "slurmd.pid",
            root / "log" / "slurmd.log",
            env,
        )
        _wait_for_idle_nodes(cluster, env, 1)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def start_on_hosts(root: Path, hosts: Sequence[Any], cpus: int = 2) -> Cluster:
    """Start a cluster over test hosts (``scripts/test_hosts.py``): one slurmd in each.

    slurmctld runs in the first host (the head node), each slurmd in its own host with the
    host's hostname as its NodeName and its address as NodeAddr; munged runs here (its socket
    is a file every host reaches). Client commands go through :meth:`Cluster.command`, inside
    the head node. The hosts should resolve each other's names (``hosts_file="resolvable"``),
    as a SLURM cluster's do.

    Raises:
        ClusterError: A daemon did not start or a node did not come up (the log is quoted).
    """
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    conf = write_config(root, cpus, [(host.hostname, host.address) for host in hosts])
    for host in hosts:
        (root / f"spool-{host.hostname}").mkdir(exist_ok=True)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    head = hosts[0]
    cluster = Cluster(root=root, conf=conf, pids={}, prefix=tuple(head.command([])))
    try:
        cluster.pids["munged"] = _start_munged(root, env)
        cluster.pids["slurmctld"] = _run_daemon(
            head.command(["slurmctld", "-f", str(conf)]),
            root / "slurmctld.pid",
            root / "log" / "slurmctld.log",
            env,
        )
        for host in hosts:
            cluster.pids[f"slurmd-{host.hostname}"] = _run_daemon(
                host.command(["slurmd", "-f", str(conf)]),
                root / f"slurmd-{host.hostname}.pid",
                root / "log" / f"slurmd-{host.hostname}.log",
                env,
            )
        _wait_for_idle_nodes(cluster, env, len(hosts))
    except BaseException:
        stop(cluster)
        raise
    return cluster


def _wait_for_idle_nodes(cluster: Cluster, env: dict[str, str], count: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    states: list[str] = []
    while time.monotonic() < deadline:
        result = subprocess.run(
            cluster.command(["sinfo", "--noheader", "--Node", "--format=%t"]),
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        states = result.stdout.split()
        if states == ["idle"] * count:
            return
        time.sleep(0.5)
    tail = (cluster.root / "log" / "slurmctld.log").read_text()[-2000:]
    raise ClusterError(
        f"the nodes are {states}, not {count} idle, after {START_TIMEOUT} s; slurmctld:\n{tail}"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(cluster: Cluster) -> None:
    """Stop the cluster's daemons by PID (SIGTERM, SIGKILL after :data:`STOP_TIMEOUT`).

    slurmd first (it ends the steps it runs), munged last. Safe to call twice.
    """
    order = sorted(cluster.pids, key=lambda name: -DAEMONS.index(name.split("-")[0]))
    for name in order:
        stop_daemon(cluster, name)


def stop_daemon(cluster: Cluster, name: str) -> None:
    """Stop one daemon (``slurmd-node1``...) by PID: SIGTERM, SIGKILL after :data:`STOP_TIMEOUT`."""
    pid = cluster.pids.pop(name, None)
    if pid is None or not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def main() -> None:
    """Start a cluster in ``argv[1]``, print its ``SLURM_CONF``, stop it on Enter."""
    cluster = start(Path(sys.argv[1]))
    try:
        print(f"export SLURM_CONF={cluster.conf}   # daemons: {cluster.pids}", flush=True)
        input("Enter stops the cluster. ")
    finally:
        stop(cluster)


if __name__ == "__main__":
    main()
