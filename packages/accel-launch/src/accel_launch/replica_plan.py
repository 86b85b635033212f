"""``--ft_*`` flags: replica groups that train on while one of them fails and is relaunched.

``accel launch --ft_replicas N --num_processes M`` runs N replica groups of M processes on this
machine, each its own torch world with its own rendezvous, and a torchft lighthouse that keeps
their quorum; ``--ft_lighthouse HOST:PORT --ft_replica_id I`` runs one group that joins a
lighthouse elsewhere (one launcher per group, for several machines). This module reads and
checks those flags; ``accel_launch.runners.replica_groups`` runs the groups.
"""

from __future__ import annotations

import dataclasses

from accel_launch.errors import LaunchArgumentError

#: Port of the lighthouse ``accel launch --ft_replicas`` starts (0: a free one, printed).
DEFAULT_LIGHTHOUSE_PORT = 0


@dataclasses.dataclass(frozen=True)
class ReplicaGroups:
    """The replica groups this launcher runs, and the lighthouse they meet at.

    Attributes:
        replicas: Replica groups in the job (``ACCEL_FT_REPLICAS``).
        min_replicas: Fewest groups a step commits with (the lighthouse's ``min_replicas``).
        replica_ids: The groups this launcher starts: all of ``0..replicas-1``, or the one
            ``--ft_replica_id`` names.
        lighthouse: ``http://host:port`` of a lighthouse elsewhere; ``None``: start one here.
    """

    replicas: int
    min_replicas: int
    replica_ids: tuple[int, ...]
    lighthouse: str | None = None


def lighthouse_url(value: str) -> str:
    """``HOST:PORT`` (or a URL) as the ``http://host:port`` torchft expects.

    Raises:
        LaunchArgumentError: The value has no port.
    """
    url = value if "://" in value else f"http://{value}"
    host_port = url.split("://", 1)[1].rstrip("/")
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchArgumentError(
            f"--ft_lighthouse {value!r} is not HOST:PORT. Pass the address and port the "
            "lighthouse listens on, e.g. --ft_lighthouse 10.0.0.1:29510."
        )
    return url.rstrip("/")


def lighthouse_host(url: str) -> str:
    """The host of a lighthouse URL (``http://10.0.0.1:29510`` -> ``10.0.0.1``, no brackets)."""
    return url.split("://", 1)[-1].rstrip("/").rpartition(":")[0].strip("[]")


def replica_groups(
    num_machines: int,
    *,
    replicas: int | None,
    min_replicas: int | None,
    lighthouse: str | None,
    replica_id: int | None,
) -> ReplicaGroups | None:
    """The replica groups the ``--ft_*`` flags ask for; ``None`` when none is given.

    Args:
        num_machines: Machines taking part (resolved from flags, config file and hostfile).
        replicas: ``--ft_replicas`` (``None``: not given), and so on for the other flags.
        min_replicas: ``--ft_min_replicas``.
        lighthouse: ``--ft_lighthouse``.
        replica_id: ``--ft_replica_id``.

    Raises:
        LaunchArgumentError: A value is out of range or the flags do not fit together; the
            message names the flag, the value and the fix.
    """
    if replicas is None and lighthouse is None and replica_id is None and min_replicas is None:
        return None
    if lighthouse is None and replica_id is not None:
        raise LaunchArgumentError(
            f"--ft_replica_id {replica_id} needs --ft_lighthouse HOST:PORT: the lighthouse of "
            "the job this replica group joins. To run every group here, pass --ft_replicas N "
            "alone."
        )
    if lighthouse is not None and replica_id is None:
        raise LaunchArgumentError(
            f"--ft_lighthouse {lighthouse} needs --ft_replica_id I: which replica group this "
            "launcher runs (one group per launcher when the lighthouse is elsewhere)."
        )
    if replicas is None and lighthouse is None:
        raise LaunchArgumentError(
            f"--ft_min_replicas {min_replicas} needs --ft_replicas N: how many replica groups "
            "to run."
        )
    if replicas is not None and replicas < 1:
        raise LaunchArgumentError(
            f"--ft_replicas {replicas} must be at least 1 (replica groups in the job)."
        )
    min_replicas = 1 if min_replicas is None else min_replicas
    if min_replicas < 1 or (replicas is not None and min_replicas > replicas):
        raise LaunchArgumentError(
            f"--ft_min_replicas {min_replicas} must be between 1 and --ft_replicas "
            f"{replicas}: a step commits when at least that many groups take part."
        )
    if lighthouse is None and num_machines > 1:
        raise LaunchArgumentError(
            f"--ft_replicas with --num_machines {num_machines}: the groups --ft_replicas "
            "starts all run on this machine. For groups on several machines, start a "
            "lighthouse (torchft_lighthouse --min_replicas K --bind [::]:29510) and run one "
            "`accel launch --ft_lighthouse HOST:29510 --ft_replica_id I` per group."
        )
    if lighthouse is not None:
        assert replica_id is not None  # checked above
        url = lighthouse_url(lighthouse)
        total = replicas if replicas is not None else replica_id + 1
        if replica_id < 0 or replica_id >= total:
            raise LaunchArgumentError(
                f"--ft_replica_id {replica_id} must be between 0 and --ft_replicas {total} - 1."
            )
        return ReplicaGroups(total, min_replicas, (replica_id,), url)
    assert replicas is not None
    return ReplicaGroups(replicas, min_replicas, tuple(range(replicas)))
