"""Read a hostfile (``--mpirun_hostfile`` / ``--hostfile``): the machines of a job, one per line.

Lines are ``host``, ``host slots=N`` (Open MPI, DeepSpeed) or ``host:N`` (MPICH); ``#`` starts a
comment. accel starts every machine through torch elastic, so the file gives the launch its
machine count, machine 0's address (the first host), the processes per machine (the slots) and,
when this machine is listed, its rank.
"""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

from accel_launch.errors import LaunchArgumentError

_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclasses.dataclass(frozen=True)
class Host:
    """One machine of a hostfile; ``slots`` is ``None`` when the line gives none."""

    name: str
    slots: int | None = None


def _parse_line(path: Path, number: int, line: str) -> Host:
    words = line.split()
    name, slots_text = words[0], None
    if ":" in name and name.count(":") == 1:
        name, slots_text = name.split(":")
    for word in words[1:]:
        key, _, value = word.partition("=")
        if key == "slots":
            slots_text = value
    if slots_text is None:
        return Host(name)
    if not slots_text.isdigit() or int(slots_text) < 1:
        raise LaunchArgumentError(
            f"hostfile {str(path)!r} line {number}: slots {slots_text!r} is not a positive "
            "integer; write e.g. 'node1 slots=4'."
        )
    return Host(name, int(slots_text))


def read_hostfile(path: str | Path) -> list[Host]:
    """The machines listed in ``path``, in order.

    Raises:
        LaunchArgumentError: The file is missing, empty, or a line is malformed.
    """
    file = Path(path).expanduser()
    try:
        text = file.read_text()
    except OSError as error:
        raise LaunchArgumentError(
            f"--mpirun_hostfile {str(path)!r} cannot be read ({error.strerror or error}); pass the "
            "path of a file listing one machine per line ('host slots=N')."
        ) from None
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            hosts.append(_parse_line(file, number, line))
    if not hosts:
        raise LaunchArgumentError(
            f"--mpirun_hostfile {str(path)!r} lists no machine; write one per line ('host slots=N')."
        )
    return hosts


def this_machine_rank(hosts: list[Host]) -> int | None:
    """The index of this machine in ``hosts`` (by host name, FQDN or a loopback name)."""
    names = {socket.gethostname(), socket.getfqdn(), *_LOCAL_NAMES}
    for index, host in enumerate(hosts):
        if host.name in names:
            return index
    return None
