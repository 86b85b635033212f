"""What the launchers of a job on several machines tell each other, through the rendezvous store.

torch elastic's agents meet in the rendezvous, but a machine that never arrives is reported as
"1/2 clients joined" after ten minutes, a machine whose launcher gave up leaves the others'
workers waiting for a collective until it times out, and on hosts whose names resolve to nothing
the c10d rendezvous cannot tell which machine hosts its store. :class:`MachineBoard` is a small
shared board in the same store (the same port; no other port is opened):

* the main machine's launcher serves the store itself (torch's rendezvous then connects to it,
  ``is_host=False`` for c10d): the static rendezvous's rank 0, or for c10d the machine whose
  addresses include the endpoint's (found by address, not by hostname);
* every launcher posts ``hostname address`` when it arrives, so a rendezvous that times out
  names the machine ranks that never came (static) or the machines that did (c10d);
* a launcher whose job failed for good posts why; the others' watchers see it within a second,
  stop their workers and exit non-zero naming that machine, instead of waiting in a collective
  for the collective timeout. Elastic ranges (``--num_machines MIN:MAX``) post nothing: there the
  other machines go on without the lost one;
* every launcher beats a counter of its own each second; the store's host watches them all and
  posts which machines are *silent* (their count stopped: powered off, link cut, launcher
  frozen), and the others read that one post. When this
  machine's workers then fail, whatever collective or store call they were waiting in, the
  report names the silent machine and its ranks, and blames no local rank for having waited
  (:meth:`MachineBoard.silent_machines`). Should the workers still wait
  :data:`SILENCE_GRACE` seconds past the collective timeout (a call with no timeout of its own),
  the launcher stops them itself.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from accel_launch.errors import JobFailedError
from accel_launch.plan import LaunchPlan
from accel_state.network import is_this_machine

#: torch's default wait of the static rendezvous (``timeout``) and of the c10d one
#: (``join_timeout``) for every machine to arrive, in seconds.
DEFAULT_ARRIVAL_TIMEOUT = 600
#: How often the watcher looks for another machine's failure, in seconds.
WATCH_INTERVAL = 1.0
#: How long posting this machine's failure may take before the launcher exits without it.
POST_TIMEOUT = 5.0
#: How long a failed launcher waits to learn whether the store's host still accepts connections.
PROBE_TIMEOUT = 3.0
_ARRIVED = "accel/launch/{run_id}/machine/{index}"
_ARRIVALS = "accel/launch/{run_id}/arrivals"
_FAILED = "accel/launch/{run_id}/failed"
_ALIVE = "accel/launch/{run_id}/alive/{index}"
_SILENT = "accel/launch/{run_id}/silent"
#: A machine whose launcher's count has not moved for this long is silent (a loaded machine
#: can stall its launcher for a few seconds without being lost).
SILENT_AFTER = 5.0
#: How long past the collective timeout this launcher lets its workers wait for a silent
#: machine before it stops them itself (every surviving machine ends within timeout + 30 s).
SILENCE_GRACE = 20.0
#: The workers' collective timeout when none was given: the first step's (accel-state's).
UNSET_COLLECTIVE_TIMEOUT = 600.0


def arrival_timeout(plan: LaunchPlan) -> int:
    """How long machines wait for each other at the rendezvous (``--rdzv_conf``, else 600 s)."""
    key = "timeout" if plan.rdzv_backend == "static" else "join_timeout"
    return int(plan.rdzv_conf.get(key, DEFAULT_ARRIVAL_TIMEOUT))


def arrival_option(plan: LaunchPlan) -> str:
    """The option that sets :func:`arrival_timeout`, as the user would type it."""
    key = "timeout" if plan.rdzv_backend == "static" else "join_timeout"
    return f"--rdzv_conf {key}=SECONDS (default {DEFAULT_ARRIVAL_TIMEOUT})"


def _serves_store(plan: LaunchPlan, host: str) -> bool:
    """Static: machine 0. c10d: the launcher the user marked ``is_host``, else by address."""
    if plan.rdzv_backend == "static":
        return plan.machine_rank == 0
    given = plan.rdzv_conf.get("is_host")
    if given is not None:
        return str(given).strip().lower() in ("1", "true", "yes", "y", "on")
    return is_this_machine(host)


class MachineBoard:
    """The launchers' shared board for one job on several machines (see the module docstring).

    Args:
        plan: The launch plan (several machines).
    """

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.host, _, port = plan.rdzv_endpoint.rpartition(":")
        self.port = int(port)
        self.timeout = arrival_timeout(plan)
        self.server: Any = None
        self.client: Any = None
        self.peer_failure: str | None = None
        self.everyone_arrived = False  # seen by the watcher: a later store error is a loss
        self.opened_at: float | None = None  # time.monotonic() when the board was opened
        self.index: int | None = None  # this machine's index on the board (its arrival)
        #: Machine index -> (its count, time.monotonic() when this launcher saw it move).
        self._beats: dict[int, tuple[int, float]] = {}
        #: The silent machines as last posted (index, seconds) and when that was (monotonic).
        self._posted: tuple[list[tuple[int, float]], float] = ([], 0.0)
        self.lost_machine: str | None = None  # why this launcher stopped its workers itself
        self._stop = threading.Event()
        self._failed_here = threading.Event()
        self._watcher: threading.Thread | None = None

    def key(self, template: str, **fields: object) -> str:
        """A board key of this job."""
        return template.format(run_id=self.plan.run_id, **fields)

    def open(self) -> None:
        """Serve the store if this is the main machine, connect, and post this machine's arrival.

        Raises:
            JobFailedError: The main machine's store could not be reached within the arrival
                timeout (the message says what to check).
        """
        from torch._C._distributed_c10d import TCPStore

        self.opened_at = time.monotonic()
        wait = datetime.timedelta(seconds=self.timeout)
        if _serves_store(self.plan, self.host):
            with contextlib.suppress(RuntimeError, ValueError, TimeoutError):  # port taken
                self.server = TCPStore(
                    self.host,
                    self.port,
                    is_master=True,
                    multi_tenant=True,
                    wait_for_workers=False,
                    timeout=wait,
                )
        try:
            self.client = self.server or TCPStore(
                self.host, self.port, is_master=False, timeout=wait
            )
        except (RuntimeError, ValueError, TimeoutError) as error:
            raise JobFailedError(self._unreachable(error)) from error
        arrived = f"{socket.gethostname()} {self.plan.local_addr or '?'}"
        index = self.plan.machine_rank
        if self.plan.rdzv_backend != "static":
            index = int(self.client.add(self.key(_ARRIVALS), 1)) - 1
        self.client.set(self.key(_ARRIVED, index=index), arrived)
        self.index = index

    @property
    def this_machine(self) -> str:
        """``machine 1 (node1)`` for the static rendezvous, ``node1`` for c10d (no fixed ranks)."""
        if self.plan.rdzv_backend == "static":
            return f"machine {self.plan.machine_rank} ({socket.gethostname()})"
        return socket.gethostname()

    def _unreachable(self, error: BaseException) -> str:
        return (
            f"{self.this_machine} could not reach the rendezvous of "
            f"machine 0 at {self.host}:{self.port} within {self.timeout} s ({error}). Check that "
            f"`accel launch` runs on machine 0 with --main_process_ip {self.host} "
            f"--main_process_port {self.port}, that this machine reaches {self.host}, and that "
            f"TCP port {self.port} is open on machine 0 (docs/clusters/several-machines.md, "
            f"ports and firewalls). The wait is {arrival_option(self.plan)}."
        )

    def arrivals(self) -> dict[int, str]:
        """Machine index -> ``hostname address`` of the machines that posted (never blocks)."""
        found: dict[int, str] = {}
        for index in range(self.plan.num_machines):
            key = self.key(_ARRIVED, index=index)
            with contextlib.suppress(Exception):
                if self.client is not None and self.client.check([key]):
                    found[index] = self.client.get(key).decode()
        return found

    def waited(self) -> float:
        """Seconds since the board was opened (when this launcher began to rendezvous)."""
        return 0.0 if self.opened_at is None else time.monotonic() - self.opened_at

    def store_answers(self) -> bool:
        """Whether the store's host still accepts a connection (a short probe, never blocks long)."""
        if self.server is not None:
            return True
        try:
            with socket.create_connection((self.host, self.port), timeout=PROBE_TIMEOUT):
                return True
        except OSError:
            return False

    def describe_missing(self, error: BaseException) -> str:
        """Why the rendezvous failed: which machines arrived and which never did.

        A store error once every machine had arrived, or while the store no longer answers,
        means the store's launcher was lost (it ended, or its link is down): not a machine that
        never came. Either way the message says how long this launcher had been running.
        """
        backend_says = str(error).strip().splitlines()[0] if str(error).strip() else ""
        waited = self.waited()
        if self.everyone_arrived or not self.store_answers():
            when = "after every machine had arrived" if self.everyone_arrived else "gone"
            static = self.plan.rdzv_backend == "static"
            host = "machine 0's launcher" if static else f"the launcher at {self.host} serving it"
            return (
                f"accel launch: lost the rendezvous store at {self.host}:{self.port} {waited:.0f} s "
                f"after this launcher started ({when}): {host} ended or its link is down. Its own "
                f"output says which. [{type(error).__name__}: {backend_says}]"
            )
        arrived = self.arrivals()
        joined = ", ".join(f"machine {index}: {text}" for index, text in sorted(arrived.items()))
        if self.plan.rdzv_backend == "static":
            missing = [i for i in range(self.plan.num_machines) if i not in arrived]
            never = f"machine(s) {', '.join(map(str, missing))} never arrived"
        else:
            fewest = self.plan.min_nodes
            never = f"{len(arrived)} machine(s) arrived, {fewest} needed"
        return (
            f"accel launch: the {self.plan.rdzv_backend} rendezvous at {self.host}:{self.port} "
            f"failed after {waited:.0f} s of waiting: {never} (arrived: {joined or 'none'}). "
            f"Start `accel launch` on every machine with --num_machines "
            f"{self.plan.num_machines} --main_process_ip {self.host} --main_process_port "
            f"{self.port}, and check that they reach {self.host} on TCP port {self.port} "
            f"(docs/clusters/several-machines.md, ports and firewalls). "
            f"The wait allowed is {self.timeout} s: {arrival_option(self.plan)}. "
            f"[{type(error).__name__}: {backend_says}]"
        )

    def job_failed_here(self) -> None:
        """This machine's workers failed: the watcher no longer stops this launcher itself.

        Without it, the watcher could read this launcher's own failure post (or its silence
        limit) and SIGTERM the launcher while it reports, ending it with -15 instead of 1.
        """
        self._failed_here.set()

    def post_failure(self, summary: str) -> None:
        """Tell the other machines that this one failed for good (fixed machine counts only)."""
        self.job_failed_here()
        if self.client is None or self.plan.min_machines is not None or self.peer_failure:
            return
        first = summary.strip().splitlines()[:2]
        text = f"{self.this_machine}: {' '.join(first)}"
        client = self.client

        def post() -> None:
            with contextlib.suppress(Exception):
                client.set(self.key(_FAILED), text)

        # A store write from a machine whose link is cut blocks until TCP gives up (minutes).
        writer = threading.Thread(target=post, name="accel-post-failure", daemon=True)
        writer.start()
        writer.join(POST_TIMEOUT)

    def watch(self) -> None:
        """Start the watcher: another machine's failure stops this launcher (SIGTERM to itself)."""
        if self.client is None or self.plan.min_machines is not None:
            return
        self._watcher = threading.Thread(target=self._watch, name="accel-machines", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        key = self.key(_FAILED)
        while not self._stop.wait(WATCH_INTERVAL):
            if not self.everyone_arrived:
                self.everyone_arrived = len(self.arrivals()) >= self.plan.num_machines
            try:
                self._beat()
                if self._silence_outlasted_the_timeout():
                    if not self._failed_here.is_set():
                        os.kill(os.getpid(), signal.SIGTERM)
                    return
                if not self.client.check([key]):
                    continue
                failure = self.client.get(key).decode()
            except Exception:  # noqa: BLE001 - the store left with machine 0: nothing to watch
                return
            if self._failed_here.is_set():
                return  # this launcher's own post, or it is reporting already
            self.peer_failure = failure
            os.kill(os.getpid(), signal.SIGTERM)  # torch's agent stops the workers and raises
            return

    def _beat(self) -> None:
        """Move this machine's count. The store's host watches everyone's and posts who is silent.

        Every other launcher reads that one post, so the store serves a few operations per
        machine per second, however many machines there are.
        """
        client = self.client
        if client is None or self.index is None:
            return
        client.add(self.key(_ALIVE, index=self.index), 1)
        if self.server is None:
            if client.check([self.key(_SILENT)]):
                posted = json.loads(client.get(self.key(_SILENT)).decode())
                self._posted = ([(int(i), float(s)) for i, s in posted], time.monotonic())
            return
        now = time.monotonic()
        for index in range(self.plan.num_machines):
            if index == self.index:
                continue
            count = int(client.add(self.key(_ALIVE, index=index), 0))
            seen = self._beats.get(index)
            if seen is None or count != seen[0]:
                self._beats[index] = (count, now)
        quiet = self._quiet()
        if quiet or self._posted[0]:
            client.set(self.key(_SILENT), json.dumps([[i, round(s, 1)] for i, s in quiet]))
            self._posted = (quiet, now)

    def _quiet(self) -> list[tuple[int, float]]:
        """On the store's host: ``(index, seconds)`` of each machine silent for SILENT_AFTER s."""
        now = time.monotonic()
        return [
            (index, now - moved)
            for index, (count, moved) in sorted(self._beats.items())
            if count > 0 and now - moved >= SILENT_AFTER
        ]

    def silent_machines(self) -> list[tuple[int, str, float]]:
        """Machines whose launcher stopped beating: ``(index, "hostname address", seconds)``.

        Only machines seen beating once count (one that never arrived is the rendezvous's
        report); silent means for :data:`SILENT_AFTER` seconds or more, up to now. The store's
        host knows it first hand; the others, from its last post (never blocking).
        """
        if not self.everyone_arrived:
            return []
        if self.server is not None:
            quiet = self._quiet()
        else:
            posted, read_at = self._posted
            quiet = [(index, seconds + time.monotonic() - read_at) for index, seconds in posted]
        if not quiet:
            return []
        arrived = self.arrivals() if self.server is not None or self.store_answers() else {}
        return [(index, arrived.get(index, "?"), seconds) for index, seconds in quiet]

    def describe_silent(self, silent: list[tuple[int, str, float]]) -> str:
        """``machine 1 (node1 198.18.0.11; ranks 2, 3) silent for 64 s`` for each silent machine."""
        parts = []
        for index, text, seconds in silent:
            what = f"machine {index} ({text}"
            if self.plan.rdzv_backend == "static":
                first = index * self.plan.nproc_per_node
                ranks = range(first, first + self.plan.nproc_per_node)
                label = "rank" if len(ranks) == 1 else "ranks"
                what += f"; {label} {', '.join(map(str, ranks))}"
            parts.append(f"{what}) silent for {seconds:.0f} s")
        return "; ".join(parts)

    def _silence_outlasted_the_timeout(self) -> bool:
        """Whether a machine has been silent longer than the workers' timeout allows (then stop)."""
        timeout = self.plan.contract.process_group_timeout or UNSET_COLLECTIVE_TIMEOUT
        silent = [entry for entry in self.silent_machines() if entry[2] >= timeout + SILENCE_GRACE]
        if not silent:
            return False
        self.lost_machine = (
            f"{self.describe_silent(silent)}: its launcher stopped answering (the machine is "
            f"down or its network link is cut), and this machine's workers were still waiting "
            f"{SILENCE_GRACE:g} s past the collective timeout ({timeout:g} s), so they were "
            "stopped"
        )
        return True

    def close(self, linger: float = 0.0) -> None:
        """Stop watching; the main machine keeps serving ``linger`` s for the others to read."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=WATCH_INTERVAL * 2)
        if self.server is not None and linger > 0:
            time.sleep(linger)
        self.client = None
        self.server = None


@contextlib.contextmanager
def machine_board(plan: LaunchPlan) -> Iterator[MachineBoard | None]:
    """A :class:`MachineBoard` open for the launch (None on one machine).

    Raises:
        JobFailedError: The main machine could not be reached (see :meth:`MachineBoard.open`).
    """
    if plan.num_machines == 1:
        yield None
        return
    board = MachineBoard(plan)
    board.open()
    try:
        yield board
    finally:
        board.close(linger=WATCH_INTERVAL * 2 if board.peer_failure is None else 0.0)
