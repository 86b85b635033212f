"""Test hosts on one Linux machine: K "machines", each a network namespace with its own hostname.

Each host is a network namespace (``ip netns``) with a UTS namespace (its own hostname) and a mount
namespace (its own ``/etc/hosts``), held open by one sleeping process; commands enter all three
with ``nsenter``. Every host has ``lo``, ``eth0`` on the cluster network (a bridge that lives in a
namespace of its own) and ``eth1`` on a network of its own that reaches no other host, as a
management or storage interface would. Addresses come from 198.18.0.0/15 (RFC 2544, reserved for
network tests) and exist only inside the namespaces: nothing binds or connects to this machine's
own interfaces. Everything is deleted by name and PID at the end, after a failure too.

Hosts files (``hosts_file``): ``"unresolvable"`` knows only localhost, so no hostname resolves;
``"debian"`` maps the host's own name to 127.0.1.1, as Debian and Ubuntu installers write it;
``"resolvable"`` maps every host's name to its cluster address.

``python scripts/test_hosts.py --hosts 2`` makes two hosts, prints how to enter each and waits for
Enter, then deletes them (needs root and iproute2's ``ip``)::

    with TestHosts(2, hosts_file="debian") as hosts:
        node0, node1 = hosts
        process = node0.popen(["python", "train.py"])
        hosts.cut(node1)  # its link goes down: a network failure, not a kill

A host's link can be slowed to a rate, and the bytes that crossed it read, to measure what a job
sends between machines (``limit_rate`` needs iproute2's ``tc`` and the kernel's ``sch_tbf``)::

    hosts.limit_rate(node1, 100)  # 100 Mbit/s each way between node1 and the bridge
    before = hosts.link_bytes(node1)
    ...  # the job runs
    crossed = hosts.link_bytes(node1) - before  # LinkBytes(sent=..., received=...)
    hosts.unlimit(node1)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

#: The cluster network: host i has 198.18.0.(10 + i).
CLUSTER_PREFIX = "198.18.0."
#: Each host's own second network: host i has 198.19.i.1 on ``eth1``.
PRIVATE_PREFIX = "198.19."
HOSTS_FILES = ("unresolvable", "debian", "resolvable")
COMMAND_TIMEOUT = 30.0
HOLDER_START_TIMEOUT = 30.0


@dataclasses.dataclass(frozen=True)
class LinkBytes:
    """Bytes that crossed a host's cluster link, as counted at the host's end (``eth0``).

    Attributes:
        sent: Bytes the host sent to the cluster network (its ``tx_bytes``).
        received: Bytes it received from there (its ``rx_bytes``).
    """

    sent: int
    received: int

    @property
    def total(self) -> int:
        """Both directions together."""
        return self.sent + self.received

    def __sub__(self, earlier: LinkBytes) -> LinkBytes:
        """What crossed between ``earlier`` and this reading."""
        return LinkBytes(self.sent - earlier.sent, self.received - earlier.received)


def job_env() -> dict[str, str]:
    """An environment for jobs on test hosts (``os.environ`` cleaned).

    Nothing of an outer launcher's, no network interface chosen (the launchers choose the one
    that routes to the other hosts), one thread per process, no GPU.
    """
    from accel_state.testing.environ import without_launcher_variables

    env = without_launcher_variables(os.environ)
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        env.pop(name, None)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    return env


class TestHostsError(RuntimeError):
    """The hosts could not be made (the message says what is missing or which command failed)."""


def unavailable_reason() -> str | None:
    """Why test hosts cannot be made here, or None when they can."""
    if sys.platform != "linux":
        return f"test hosts need Linux network namespaces, not {sys.platform}"
    if os.geteuid() != 0:
        return "test hosts need root (ip netns add, nsenter)"
    missing = [name for name in ("ip", "nsenter", "unshare") if shutil.which(name) is None]
    if missing:
        return f"test hosts need {', '.join(missing)} on PATH (iproute2, util-linux)"
    return None


def _run(command: Sequence[str]) -> None:
    result = subprocess.run(
        list(command), capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
    )
    if result.returncode != 0:
        raise TestHostsError(f"`{' '.join(command)}` failed: {result.stderr.strip()}")


@dataclasses.dataclass
class TestHost:
    """One test host.

    Attributes:
        index: Its position, 0..K-1.
        hostname: Its own hostname (``node<index>`` unless given).
        namespace: The network namespace's name under ``ip netns``.
        address: Its address on the cluster network (``eth0``).
        private_address: Its address on ``eth1``, which reaches no other host.
        switch_port: The bridge's port for this host, in the switch namespace.
        holder_pid: The process holding its UTS and mount namespaces.
    """

    __test__ = False  # not a pytest test class

    index: int
    hostname: str
    namespace: str
    address: str
    private_address: str
    switch_port: str
    holder_pid: int = 0

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host (its network, hostname and mounts)."""
        return [
            "nsenter",
            f"--target={self.holder_pid}",
            "--net",
            "--uts",
            "--mount",
            "--",
            *argv,
        ]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
        """Start ``argv`` inside this host in a session of its own (text mode).

        Args:
            argv: The command.
            **kwargs: Passed to :class:`subprocess.Popen` (``env``, ``stdout``, ``cwd``...).
        """
        kwargs.setdefault("text", True)
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(self.command(argv), **kwargs)

    def run(
        self, argv: Sequence[str], timeout: float = COMMAND_TIMEOUT, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this host to completion (output captured, never raises on status)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(argv), timeout=timeout, check=False, **kwargs)


class TestHosts:
    """K test hosts joined by one bridge; a context manager that deletes everything on exit.

    Args:
        count: How many hosts.
        hosts_file: ``"unresolvable"``, ``"debian"`` or ``"resolvable"`` (see the module doc).
        hostnames: Their hostnames (default ``node0``, ``node1``...).
        prefix: Start of every namespace name (default ``accel-<pid>``), so that concurrent runs
            never share a name.
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        count: int,
        hosts_file: str = "unresolvable",
        hostnames: Sequence[str] | None = None,
        prefix: str | None = None,
    ) -> None:
        if count < 1 or count > 200:
            raise TestHostsError(f"count={count}: make between 1 and 200 test hosts")
        if hosts_file not in HOSTS_FILES:
            raise TestHostsError(
                f"hosts_file={hosts_file!r} is not one of {', '.join(HOSTS_FILES)}"
            )
        names = list(hostnames or (f"node{i}" for i in range(count)))
        if len(names) != count:
            raise TestHostsError(f"hostnames={names} names {len(names)} hosts, not {count}")
        self.hosts_file = hosts_file
        self.prefix = prefix or f"accel-{os.getpid()}"
        self.switch = f"{self.prefix}-sw"
        self.hosts = [
            TestHost(
                index=i,
                hostname=name,
                namespace=f"{self.prefix}-h{i}",
                address=f"{CLUSTER_PREFIX}{10 + i}",
                private_address=f"{PRIVATE_PREFIX}{i}.1",
                switch_port=f"port{i}",
            )
            for i, name in enumerate(names)
        ]
        self.folder = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-hosts-"))
        self._namespaces: list[str] = []
        self._holders: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> TestHosts:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __iter__(self) -> Iterator[TestHost]:
        return iter(self.hosts)

    def __getitem__(self, index: int) -> TestHost:
        return self.hosts[index]

    def __len__(self) -> int:
        return len(self.hosts)

    def start(self) -> None:
        """Make the switch, then every host.

        Raises:
            TestHostsError: A command failed (root and iproute2 are needed).
        """
        reason = unavailable_reason()
        if reason:
            raise TestHostsError(reason)
        self._add_namespace(self.switch)
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for host in self.hosts:
            self._make_host(host)

    def _add_namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)

    def _make_host(self, host: TestHost) -> None:
        namespace = host.namespace
        self._add_namespace(namespace)
        ip = ["ip", "-n", namespace]
        _run([*ip, "link", "set", "lo", "up"])
        _run([*ip, "link", "add", "eth0", "type", "veth", "peer", "name", host.switch_port,
              "netns", self.switch])  # fmt: skip
        _run(["ip", "-n", self.switch, "link", "set", host.switch_port, "master", "br0", "up"])
        _run([*ip, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        _run([*ip, "link", "set", "eth0", "up"])
        # eth1's peer stays in the switch namespace, on no bridge: a network reaching nothing.
        _run([*ip, "link", "add", "eth1", "type", "veth", "peer", "name", f"private{host.index}",
              "netns", self.switch])  # fmt: skip
        _run([*ip, "addr", "add", f"{host.private_address}/24", "dev", "eth1"])
        _run([*ip, "link", "set", "eth1", "up"])
        hosts = self.folder / f"{host.hostname}.hosts"
        hosts.write_text(self._hosts_text(host))
        # The holder gets its own UTS and mount namespaces, then enters the network namespace
        # and mounts a sysfs of it (as `ip netns exec` does), so /sys/class/net lists this
        # host's interfaces; this machine's cgroup tree, kept aside first, is bound back under
        # it so that daemons that need it (slurmd) run.
        kept = self.folder / f"{host.hostname}.cgroup"
        kept.mkdir()
        inside = (
            "umount -l /sys && mount -t sysfs sysfs /sys && "
            f"{{ mount --rbind {kept} /sys/fs/cgroup || true; }} && echo ready && "
            "exec sleep infinity"
        )
        holder = (
            f"hostname {host.hostname} && mount --bind {hosts} /etc/hosts && "
            f"{{ mount --rbind /sys/fs/cgroup {kept} || true; }} && "
            f"exec nsenter --net=/run/netns/{namespace} -- sh -c {shlex.quote(inside)}"
        )
        process = subprocess.Popen(
            ["unshare", "--uts", "--mount", "--propagation", "private", "--", "sh", "-c", holder],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._holders.append(process)
        host.holder_pid = process.pid
        assert process.stdout is not None
        line = process.stdout.readline().decode().strip()
        if line != "ready":
            rest = process.stdout.read().decode() if process.poll() is not None else ""
            raise TestHostsError(
                f"host {host.hostname}: its namespace holder did not start: {line} {rest}".strip()
            )

    def _hosts_text(self, host: TestHost) -> str:
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        if self.hosts_file == "debian":
            lines.append(f"127.0.1.1 {host.hostname}")
        elif self.hosts_file == "resolvable":
            lines.extend(f"{other.address} {other.hostname}" for other in self.hosts)
        return "\n".join(lines) + "\n"

    def cut(self, host: TestHost) -> None:
        """Take ``host``'s link to the cluster network down at the bridge (a network failure)."""
        _run(["ip", "-n", self.switch, "link", "set", host.switch_port, "down"])

    def mend(self, host: TestHost) -> None:
        """Bring ``host``'s link back up."""
        _run(["ip", "-n", self.switch, "link", "set", host.switch_port, "up"])

    def limit_rate(
        self, host: TestHost, mbit: float, burst_kbit: int = 32, latency_ms: int = 400
    ) -> None:
        """Limit ``host``'s link to ``mbit`` Mbit/s in each direction (a token bucket, ``tbf``).

        The bucket goes on both ends of the link: the bridge's port (what the host receives)
        and the host's ``eth0`` (what it sends). Traffic between two hosts crosses both of their
        links, so limiting one host's link limits everything it exchanges. Calling it again
        replaces the limit.

        Args:
            host: The host whose link is slowed.
            mbit: The rate, in Mbit/s (1 Mbit = 10**6 bits).
            burst_kbit: The bucket's size: how much may go at once above the rate.
            latency_ms: How long a packet may wait for tokens before it is dropped.

        Raises:
            TestHostsError: ``mbit`` is not positive, or ``tc`` failed (not installed, or the
                kernel has no ``sch_tbf``).
        """
        if mbit <= 0:
            raise TestHostsError(f"mbit={mbit}: the rate must be positive (Mbit/s)")
        if shutil.which("tc") is None:
            raise TestHostsError("limit_rate needs iproute2's tc on PATH")
        shape = ["tbf", "rate", f"{mbit}mbit", "burst", f"{burst_kbit}kbit",
                 "latency", f"{latency_ms}ms"]  # fmt: skip
        for namespace, device in self._link_ends(host):
            _run(["tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", *shape])

    def unlimit(self, host: TestHost) -> None:
        """Take off the limit :meth:`limit_rate` put on ``host``'s link (none: nothing happens)."""
        for namespace, device in self._link_ends(host):
            subprocess.run(
                ["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"],
                capture_output=True,
                timeout=COMMAND_TIMEOUT,
                check=False,
            )

    def link_bytes(self, host: TestHost) -> LinkBytes:
        """The bytes that crossed ``host``'s cluster link so far (both ways, since it was made).

        Counted by the kernel at the host's ``eth0``: everything the host exchanged with the
        other hosts, headers included, and nothing of its loopback traffic. Subtract two readings
        to get what crossed in between.

        Raises:
            TestHostsError: ``ip`` failed (the host is gone).
        """
        command = ["ip", "-n", host.namespace, "-j", "-s", "link", "show", "dev", "eth0"]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
        )
        if result.returncode != 0:
            raise TestHostsError(f"`{' '.join(command)}` failed: {result.stderr.strip()}")
        stats = json.loads(result.stdout)[0]["stats64"]
        return LinkBytes(sent=int(stats["tx"]["bytes"]), received=int(stats["rx"]["bytes"]))

    def _link_ends(self, host: TestHost) -> list[tuple[str, str]]:
        """``(namespace, device)`` of both ends of ``host``'s cluster link."""
        return [(self.switch, host.switch_port), (host.namespace, "eth0")]

    def processes(self, host: TestHost) -> list[int]:
        """The PIDs of every process inside ``host``'s network namespace (the holder included)."""
        try:
            inode = os.stat(f"/run/netns/{host.namespace}").st_ino
        except OSError:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                        found.append(int(entry))
        return found

    def terminate(self, host: TestHost, grace: float = 15.0) -> None:
        """End every process running in ``host`` but its namespace holder, by PID.

        SIGTERM first, SIGKILL whatever is left after ``grace`` seconds: daemons started in a
        host (Ray's, say) stop as on their own machine, and nothing outside the host is touched.
        """
        pids = [pid for pid in self.processes(host) if pid != host.holder_pid]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in pids):
            time.sleep(0.2)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop every process left in the hosts and delete every namespace made; never raises.

        Processes are found by the network namespace they are in and killed by PID: a job on a
        host whose link was cut (or whose scheduler daemon was stopped) may still be waiting.
        """
        for host in self.hosts:
            for pid in self.processes(host):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for process in self._holders:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=COMMAND_TIMEOUT)
            if process.stdout is not None:
                process.stdout.close()
        self._holders.clear()
        for name in reversed(self._namespaces):
            subprocess.run(
                ["ip", "netns", "delete", name],
                capture_output=True,
                timeout=COMMAND_TIMEOUT,
                check=False,
            )
        self._namespaces.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


def stop_process_tree(process: subprocess.Popen[str], grace: float = 10.0) -> None:
    """SIGTERM ``process``'s session, SIGKILL it after ``grace`` seconds; reap it."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, COMMAND_TIMEOUT)):
        if process.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever the session left behind


def main(argv: Sequence[str] | None = None) -> int:
    """Make hosts, print how to enter them, wait for Enter (or SIGTERM), delete them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2, help="how many hosts (default 2)")
    parser.add_argument("--hosts_file", choices=HOSTS_FILES, default="unresolvable")
    args = parser.parse_args(argv)
    with TestHosts(args.hosts, hosts_file=args.hosts_file) as hosts:
        for host in hosts:
            print(
                f"{host.hostname}: eth0 {host.address}, eth1 {host.private_address}; enter with "
                f"`{' '.join(host.command(['bash']))}`"
            )
        print("Press Enter to delete the hosts.", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(EOFError, KeyboardInterrupt):
            input()
    return 0


if __name__ == "__main__":
    sys.exit(main())
