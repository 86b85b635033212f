"""The one module of accel that calls torchft (replica groups that survive one another's failure).

torchft's API changes between releases, so every call into it goes through here; the rest of
accel sees :class:`Lighthouse` and the functions below. torchft is optional: ``pip install
'accel[ft]'`` (or ``'accel-launch[ft]'``) brings the release these functions are written for,
:data:`TORCHFT_REQUIREMENT`. torchft's ``TORCHFT_*`` variables override the values passed to its
constructors; :data:`TORCHFT_OVERRIDES` names the ones that matter here.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta
from types import ModuleType
from typing import Any

import torch
from torch._C._distributed_c10d import TCPStore

from accel_state.errors import FaultToleranceUnavailableError, ReplicaQuorumError
from accel_state.torch_compat import GATES

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
#: How long a new quorum waits for groups of the previous one that still heartbeat (torchft's
#: default). It must exceed the longest step: with a shorter wait, a group busy in a step is
#: left out, and two groups can each form quorums of their own and train apart. It does not
#: slow recovery: a dead group stops heartbeating and is no longer waited for.
DEFAULT_JOIN_TIMEOUT_MS = 60_000


#: torchft's Rust side logs every quorum and commit at INFO; accel shows its warnings only,
#: unless ``RUST_LOG`` is set (``RUST_LOG=info`` shows them all).
DEFAULT_RUST_LOG = "warn"


def quiet_torchft_logs(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``RUST_LOG`` set to :data:`DEFAULT_RUST_LOG` unless it is set already."""
    return {"RUST_LOG": DEFAULT_RUST_LOG, **env}


def import_torchft_native() -> ModuleType:
    """The compiled module of torchft (lighthouse, manager server), or an error naming the fix.

    Raises:
        TorchFeatureError: torch is older than torchft needs (``GATES["replica_groups"]``).
        FaultToleranceUnavailableError: torchft is not installed.
    """
    GATES["replica_groups"].require()
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


class ReplicaManager:
    """torchft's ``Manager`` of this process, reduced to what accel's training steps use.

    One step: :meth:`start_step` (forms the quorum; heals this group from a live one when it is
    behind), :meth:`average` of the gradients across the groups taking part, then
    :meth:`should_commit`, which every group answers alike.
    """

    def __init__(
        self,
        manager: Any,
        *,
        replica_id: int,
        group_rank: int,
        group_size: int,
        lighthouse: str,
        store: Any = None,
    ) -> None:
        self._manager = manager
        self.replica_id = replica_id
        self.lighthouse = lighthouse
        self._store = store  # the group's own store when it has no process group
        self.group_rank = group_rank
        self.group_size = group_size

    def start_step(self) -> None:
        """Form this step's quorum (blocking); a group that is behind is healed here.

        Raises:
            ReplicaQuorumError: No quorum within the quorum timeout (too few groups alive), or
                the lighthouse cannot be reached.
        """
        try:
            self._manager.start_quorum()
        except Exception as error:  # torchft raises its transport's errors as they come
            manager = self._manager
            raise ReplicaQuorumError(
                f"replica group {self.replica_id} got no quorum for step "
                f"{manager.current_step()} within {self.quorum_timeout_s:g} s "
                f"({type(error).__name__}: {error}). A step needs min_replicas="
                f"{manager._min_replica_size} live replica groups and a reachable lighthouse "
                f"({self.lighthouse}); start or relaunch the missing groups (accel launch "
                "--max_restarts), lower --ft_min_replicas, or raise TORCHFT_QUORUM_TIMEOUT_SEC."
            ) from error

    def average(self, tensors: list[Any]) -> None:
        """Average ``tensors`` in place over the groups taking part (zeros if this one is not).

        After a failure inside the collective the tensors hold garbage, and
        :meth:`should_commit` answers False.
        """
        works = [self._manager.allreduce(tensor) for tensor in tensors]
        for work in works:
            work.wait()

    def average_value(self, value: float, device: Any) -> float | None:
        """``value`` averaged over the groups of the last quorum; ``None`` if a group failed.

        One collective across the groups, outside a step (the quorum of the last step is used):
        every group of that quorum must call it at the same point of its program.
        """
        tensor = torch.tensor([float(value)], dtype=torch.float32, device=device)
        self.average([tensor])
        if self._manager.errored() is not None:
            return None
        return float(tensor.item())

    def should_commit(self) -> bool:
        """Whether every group of the quorum finished the step without error (ends the step)."""
        return bool(self._manager.should_commit())

    def report_error(self, reason: str) -> None:
        """Make this step fail: :meth:`should_commit` answers False in every group of the quorum."""
        self._manager.report_error(RuntimeError(reason))

    @property
    def participants(self) -> int:
        """Replica groups taking part in the step now open."""
        return int(self._manager.num_participants())

    @property
    def participant_rank(self) -> int | None:
        """This group's place among them (``None``: not taking part)."""
        rank = self._manager.participating_rank()
        return None if rank is None else int(rank)

    @property
    def quorum_timeout_s(self) -> float:
        """Seconds a step waits for its quorum (``TORCHFT_QUORUM_TIMEOUT_SEC`` wins)."""
        return float(self._manager._quorum_timeout.total_seconds())

    @property
    def committed_steps(self) -> int:
        """Steps the job has committed (healed along with the state)."""
        return int(self._manager.current_step())

    def shutdown(self) -> None:
        """Stop this process's manager threads and its checkpoint server."""
        self._manager.shutdown(wait=False)


def create_replica_manager(
    *,
    device_type: str,
    group_rank: int,
    group_size: int,
    replica_id: int,
    min_replicas: int,
    lighthouse: str | None,
    timeout_s: float,
    quorum_timeout_s: float,
    connect_timeout_s: float,
    state_dict: Any,
    load_state_dict: Any,
    address: str | None = None,
) -> ReplicaManager:
    """A torchft ``Manager`` for this process of replica group ``replica_id``.

    Call after this group's process group exists: the manager joins the group's store
    (``MASTER_ADDR``/``MASTER_PORT``). The quorum is formed synchronously, so a group that is
    behind heals before its step starts, and takes part in that step.

    Args:
        device_type: ``"cuda"`` averages over NCCL across groups, anything else over gloo.
        group_rank: This process's rank inside its replica group.
        group_size: Processes per replica group.
        replica_id: This group's number (``0..N-1``).
        min_replicas: Fewest groups a step commits with.
        lighthouse: The lighthouse address (``None``: ``TORCHFT_LIGHTHOUSE``).
        timeout_s: Collectives, commit votes and healing transfers.
        quorum_timeout_s: How long a step waits for its quorum.
        connect_timeout_s: Connecting to the lighthouse and to peers' managers.
        state_dict: Returns what a healing group copies (called from torchft's thread).
        load_state_dict: Takes that copy in (called before the healed step starts).
        address: This machine's address as the other groups reach it (``accel launch
            --ft_lighthouse`` writes it as ``ACCEL_FT_ADDRESS``). It is published for this
            group's manager, its healing copies and, when ``MASTER_ADDR`` is a loopback address,
            its store (which listens on every interface). ``None``: torchft publishes the
            hostname and ``MASTER_ADDR``, which works on one machine only unless the hostname
            resolves to an address the other machines reach.

    Raises:
        FaultToleranceUnavailableError: torchft is not installed.
    """
    import_torchft_native()
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    # torchft's Manager reads TORCHFT_TIMEOUT_SEC over its argument; the process group across
    # groups must time out alike (else a group stuck configuring it outlives the quorum timeout).
    timeout = timedelta(seconds=float(os.environ.get("TORCHFT_TIMEOUT_SEC", timeout_s)))
    store = None
    store_host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if address is not None and _is_loopback(store_host):
        store_host = address  # the store listens on every interface: publish a reachable one
    store_port = int(os.environ["MASTER_PORT"]) if "MASTER_PORT" in os.environ else None
    if group_size == 1:
        # A one-process group has no process group (and so no store) of its own; the other
        # groups reach this one's store, so it listens where MASTER_ADDR says.
        store = TCPStore(
            store_host, 0, world_size=1, is_master=True, wait_for_workers=False, timeout=timeout
        )
        store_port = store.port
    process_group = (
        ProcessGroupNCCL(timeout=timeout)
        if device_type == "cuda"
        else ProcessGroupGloo(timeout=timeout)
    )
    published = {} if address is None else _published_at(address, timeout)
    manager = Manager(
        pg=process_group,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=min_replicas,
        use_async_quorum=False,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=quorum_timeout_s),
        connect_timeout=timedelta(seconds=connect_timeout_s),
        rank=group_rank,
        world_size=group_size,
        store_addr=store_host,
        store_port=store_port,
        lighthouse_addr=lighthouse,
        # torchft numbers the cross-group ranks by the digits that end the id.
        replica_id=f"replica_{replica_id}",
        **published,
    )
    return ReplicaManager(
        manager,
        replica_id=replica_id,
        group_rank=group_rank,
        group_size=group_size,
        lighthouse=lighthouse or os.environ.get("TORCHFT_LIGHTHOUSE", "TORCHFT_LIGHTHOUSE unset"),
        store=store,
    )


def _is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback (``127.x``, ``::1``, ``localhost``)."""
    return host == "localhost" or host.startswith("127.") or host in ("::1", "[::1]")


def _published_at(address: str, timeout: timedelta) -> dict[str, Any]:
    """The ``Manager`` arguments that publish ``address`` instead of this machine's hostname.

    torchft publishes ``socket.gethostname()`` for the manager server and for the HTTP server a
    healing group copies the state from; a hostname may resolve nowhere, or to 127.0.1.1.
    """
    from torchft.checkpointing.http_transport import HTTPTransport

    host = f"[{address}]" if ":" in address else address

    class PublishedHTTPTransport(HTTPTransport[Any]):  # type: ignore[misc]  # untyped torchft
        """torchft's HTTP checkpoint transport, reached at ``address``."""

        def address(self) -> str:
            """Where the other groups fetch this process's state (``.../checkpoint/``)."""
            port = self._server.socket.getsockname()[1]
            return f"http://{host}:{port}/checkpoint/"

    return {
        "hostname": host,
        "checkpoint_transport": PublishedHTTPTransport(timeout=timeout, num_chunks=0),
    }


class OuterSync:
    """torchft's (streaming) DiLoCo, driven by accel one phase of a sync at a time.

    torchft's ``DiLoCo`` runs its syncs from optimizer hooks; accel instead calls the phases of
    one sync itself, so that it can form the sync's quorum, refuse the sync when the groups
    changed since the round's samples were split, and account the round's samples:
    :meth:`start` (the pseudo-gradient all-reduce of the fragment due, once the caller formed
    the quorum, which may heal this group), then
    :meth:`finish` (outer step on commit; parameters restored to the last sync otherwise).

    Example:
        >>> sync = create_diloco(manager, [model], optimizer, [outer], sync_every=8)
        >>> manager.start_step()
        >>> sync.start()
        >>> committed = sync.finish()
    """

    def __init__(self, diloco: Any, manager: ReplicaManager) -> None:
        self._diloco = diloco
        self.manager = manager
        self._fragment: Any = None

    @property
    def fragments(self) -> int:
        """Fragments of the model (1: plain DiLoCo)."""
        return len(self._diloco._fragments)

    @property
    def started(self) -> bool:
        """Whether a sync was started and not finished."""
        return self._fragment is not None

    def start(self) -> None:
        """Start the due fragment's pseudo-gradient all-reduce, in the quorum formed last.

        The caller forms the sync's quorum first (``manager.start_step()``, which may heal this
        group), so that it can decide on the sync in between.
        """
        # torchft picks the fragment from the committed step (healed with the state).
        self._fragment = self._diloco._fragments[self._diloco._current_fragment()]
        self._fragment.prepare_sync()

    def finish(self) -> bool:
        """Wait for the all-reduce, vote, and apply the outer step if every group committed."""
        fragment, self._fragment = self._fragment, None
        return bool(fragment.perform_sync())


def create_diloco(
    manager: ReplicaManager,
    fragments: list[torch.nn.Module],
    inner_optimizer: torch.optim.Optimizer,
    outer_optimizers: list[torch.optim.Optimizer],
    sync_every: int,
    *,
    fragment_sync_delay: int = 0,
    fragment_update_alpha: float = 0.0,
    should_quantize: bool = False,
) -> OuterSync:
    """The torchft ``DiLoCo`` over ``fragments``, for :class:`OuterSync` to drive.

    It copies the parameters now (the state the first sync starts from) and registers the
    fragments' last synced parameters and outer optimizers with the manager, so that a healing
    group copies them. Check the arguments first: torchft answers bad ones with bare errors.

    Example:
        >>> sync = create_diloco(manager, [model], optimizer, [torch.optim.SGD(...)], 8)

    Args:
        manager: This process's replica manager (synchronous quorum).
        fragments: The model's fragments (one module: plain DiLoCo).
        inner_optimizer: The optimizer that steps every inner step.
        outer_optimizers: One outer optimizer per fragment.
        sync_every: Inner steps between two syncs of the same fragment.
        fragment_sync_delay: Inner steps between starting and applying a fragment's average.
        fragment_update_alpha: Share of the local parameters mixed into a synced fragment.
        should_quantize: Quantize the pseudo-gradients (CUDA and triton only).

    Raises:
        FaultToleranceUnavailableError: torchft is not installed.
    """
    import_torchft_native()
    from torchft.local_sgd import DiLoCo

    diloco = DiLoCo(
        manager._manager,
        fragments,
        inner_optimizer,
        outer_optimizers,
        sync_every=sync_every,
        fragment_sync_delay=fragment_sync_delay,
        fragment_update_alpha=fragment_update_alpha,
        should_quantize=should_quantize,
    )
    return OuterSync(diloco, manager)
