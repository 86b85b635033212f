"""The one module of accel that calls torchft (replica groups that survive one another's failure).

torchft's API changes between releases, so every call into it goes through here; the rest of
accel sees :class:`Lighthouse` and the functions below. torchft is optional: ``pip install
'accel[ft]'`` (or ``'accel-launch[ft]'``) brings the release these functions are written for,
:data:`TORCHFT_REQUIREMENT`. torchft's ``TORCHFT_*`` variables override the values passed to its
constructors; :data:`TORCHFT_OVERRIDES` names the ones that matter here.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

from accel_state.errors import FaultToleranceUnavailableError

#: The torchft release accel is written against (the ``ft`` extras pin it).
TORCHFT_REQUIREMENT = "torchft==0.2.0"
#: torchft variables that win over what accel passes: timeouts of its Manager and its port.
TORCHFT_OVERRIDES = (
    "TORCHFT_TIMEOUT_SEC",
    "TORCHFT_QUORUM_TIMEOUT_SEC",
    "TORCHFT_CONNECT_TIMEOUT_SEC",
    "TORCHFT_QUORUM_RETRIES",
    "TORCHFT_MANAGER_PORT",
)
#: How often the lighthouse forms a new quorum, and how long a silent replica stays counted.
DEFAULT_QUORUM_TICK_MS = 100
DEFAULT_HEARTBEAT_TIMEOUT_MS = 5000
#: How long a new quorum waits for replica groups that were there before (after a failure, the
#: survivors must not wait for the dead one longer than this).
DEFAULT_JOIN_TIMEOUT_MS = 1000


def import_torchft_native() -> ModuleType:
    """The compiled module of torchft (lighthouse, manager server), or an error naming the fix.

    Raises:
        FaultToleranceUnavailableError: torchft is not installed.
    """
    try:
        from torchft import _torchft
    except ImportError as error:
        raise FaultToleranceUnavailableError(
            "fault tolerance across replica groups needs torchft, which is not installed "
            f"({error}). Install it with: pip install 'accel-launch[ft]' (or 'accel[ft]'), "
            f"which pins {TORCHFT_REQUIREMENT}"
        ) from error
    native: ModuleType = _torchft
    return native


@dataclasses.dataclass
class Lighthouse:
    """A torchft lighthouse running in this process: the quorum keeper of the replica groups.

    Attributes:
        address: Where replica groups reach it (``http://host:port``), as ``TORCHFT_LIGHTHOUSE``.
        min_replicas: Fewest replica groups a quorum (and so a committed step) needs.
    """

    address: str
    min_replicas: int
    server: Any = dataclasses.field(repr=False)

    def shutdown(self) -> None:
        """Stop serving (replica groups still running lose their quorum keeper)."""
        self.server.shutdown()


def start_lighthouse(
    host: str,
    port: int,
    min_replicas: int,
    join_timeout_ms: int = DEFAULT_JOIN_TIMEOUT_MS,
    heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS,
    quorum_tick_ms: int = DEFAULT_QUORUM_TICK_MS,
) -> Lighthouse:
    """Start a lighthouse bound to ``host:port`` (port 0: a free one) in this process.

    Args:
        host: Address to bind and to publish (``127.0.0.1`` for one machine).
        port: Port to bind; 0 picks a free one.
        min_replicas: Fewest replica groups in a quorum.
        join_timeout_ms: How long a quorum waits for groups that were in the previous one.
        heartbeat_timeout_ms: Silence after which a group is counted as gone.
        quorum_tick_ms: How often the lighthouse checks whether a quorum can form.

    Raises:
        FaultToleranceUnavailableError: torchft is not installed.
    """
    native = import_torchft_native()
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    server = native.LighthouseServer(
        bind=bind,
        min_replicas=min_replicas,
        join_timeout_ms=join_timeout_ms,
        quorum_tick_ms=quorum_tick_ms,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
    )
    # torchft publishes this machine's hostname, which may resolve nowhere (or to 127.0.1.1):
    # publish the address it is bound to instead.
    bound_port = int(str(server.address()).rsplit(":", 1)[1].strip("/"))
    published = f"[{host}]" if ":" in host else host
    return Lighthouse(
        address=f"http://{published}:{bound_port}", min_replicas=min_replicas, server=server
    )
