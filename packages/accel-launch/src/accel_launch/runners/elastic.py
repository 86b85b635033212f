"""Multi-process and multi-machine jobs through PyTorch's elastic agent (what ``torchrun`` runs).

The agent starts ``nproc_per_node`` workers with torchrun's variables, joins the rendezvous (static
or c10d), restarts the whole group up to ``max_restarts`` times, and stops every worker as soon as
one fails or the launcher gets SIGINT/SIGTERM. A failed worker's traceback reaches the console
through its own stderr (or the ``--tee`` log files); the launcher then prints which rank failed
and, side by side, the collective each rank waited in or last entered (from the workers' error
files, or torch's Flight Recorder dumps on GPUs).

Elastic membership (``--num_machines MIN:MAX``, c10d rendezvous, torch 2.13): the launcher that
first binds ``--main_process_ip:--main_process_port`` hosts the rendezvous store for the whole job,
so the job lives as long as that launcher does. When another machine is lost for good, its peers'
collectives fail, their agents restart the workers (one of ``--max_restarts``) and rejoin the
rendezvous; the next round opens once the lost launcher's keep-alive has expired
(``keep_alive_interval`` x ``keep_alive_max_attempt`` seconds, 5 x 3 by default) and closes
``last_call_timeout`` seconds (30 by default) after MIN machines joined, or at once with MAX.
Ranks are renumbered 0..n-1 in each round. If the store host itself is lost, the others cannot
rendezvous again and fail with a rendezvous connection error: relaunch them (fewer, with
``--num_machines MIN:MAX`` unchanged) and the scripts resume from their newest checkpoint.

SIGTERM (what schedulers send before a kill) is forwarded to every worker by torch's agent, which
gives them ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds (default 30) to save and exit; the launcher
then exits with :data:`accel_state.contract.REQUEUE_EXIT_CODE` (75), asking the scheduler to
requeue the job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from accel_launch._failure_recorder import COLLECTIVES_KEY, TIMESTAMP_KEY
from accel_launch.plan import LaunchPlan
from accel_launch.runners import flight_recorder
from accel_launch.runners.environ import extended_environ
from accel_launch.runners.guard import guarded
from accel_launch.runners.machines import machine_board
from accel_state.contract import REQUEUE_EXIT_CODE
from accel_state.failures import RankFailure, first_failure, is_secondary_failure
from accel_state.network import user_choice

_ELASTIC_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher")


@contextlib.contextmanager
def _default_signals() -> Iterator[None]:
    """Let SIGINT/SIGTERM/SIGHUP kill the launcher outright until torch elastic takes them over.

    While the agent waits in the rendezvous it is blocked in C++, where Python-level handlers
    (KeyboardInterrupt included) never run; no worker exists yet, so dying at once is right. Once
    workers start, torch installs handlers that stop them before the launcher exits.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = ("SIGINT", "SIGTERM", "SIGHUP")
    numbers = [getattr(signal, name) for name in names if hasattr(signal, name)]
    previous = {number: signal.signal(number, signal.SIG_DFL) for number in numbers}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def _log_dir(requested: str | None) -> Iterator[str]:
    """The agent needs a folder for error files; a temporary one is removed afterwards."""
    if requested:
        yield requested
        return
    folder = tempfile.mkdtemp(prefix="accel_launch_")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _quiet(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    loggers = [logging.getLogger(name) for name in _ELASTIC_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _launch_config(plan: LaunchPlan, log_dir: str) -> Any:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    tee = Std.from_str(plan.tee) if plan.tee else Std.NONE
    rdzv_configs: dict[str, Any] = dict(plan.rdzv_conf)
    if plan.rdzv_backend == "static":
        rdzv_configs["rank"] = plan.machine_rank
    if plan.rdzv_backend == "c10d" and plan.num_machines > 1:
        # The MachineBoard of the main machine (or of the launcher given is_host=1) serves the
        # store before the agent starts; every agent connects to it.
        rdzv_configs["is_host"] = False
    elif plan.rdzv_backend == "c10d" and "is_host" not in rdzv_configs:
        # torch decides by resolving the hostname, which fails where it resolves nowhere.
        rdzv_configs["is_host"] = True
    return LaunchConfig(
        min_nodes=plan.min_nodes,
        max_nodes=plan.num_machines,
        nproc_per_node=plan.nproc_per_node,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir, tee=tee),
        run_id=plan.run_id,
        role=plan.role,
        rdzv_endpoint=plan.rdzv_endpoint,
        rdzv_backend=plan.rdzv_backend,
        rdzv_configs=rdzv_configs,
        max_restarts=plan.max_restarts,
        monitor_interval=plan.monitor_interval,
        start_method="spawn",
        local_addr=plan.local_addr,
    )


def _rank_failure(global_rank: int, failure: Any) -> RankFailure:
    """Our view of one elastic ``ProcessFailure``: exact time and text where the worker wrote them."""
    message = failure.error_file_data.get("message") if failure.error_file_data else None
    if not isinstance(message, dict):  # no error file: torch stores the placeholder "<NONE>"
        return RankFailure(global_rank, float(failure.timestamp))
    extra = message.get("extraInfo", {})
    try:
        when = float(extra.get(TIMESTAMP_KEY, failure.timestamp))
    except (TypeError, ValueError):
        when = float(failure.timestamp)
    return RankFailure(global_rank, when, str(extra.get("py_callstack") or message.get("message")))


def _collectives(failure: Any) -> str:
    """Where a failed worker's collectives were, as its error file says (empty when it does not)."""
    message = failure.error_file_data.get("message") if failure.error_file_data else None
    if not isinstance(message, dict) or not isinstance(message.get("extraInfo"), dict):
        return ""
    return str(message["extraInfo"].get(COLLECTIVES_KEY) or "")


def side_by_side(reported: dict[int, str], ranks: Any) -> str:
    """``rank 0 waits in gather #57 (train.py:42); rank 1 last entered ...`` for ``ranks``."""
    return "; ".join(
        f"rank {rank} {reported[rank]}" if reported.get(rank) else f"rank {rank}: no report"
        for rank in sorted(ranks)
    )


def describe_failure(
    error: Any,
    who: str = "accel launch",
    dumps: dict[int, str] | None = None,
    silent: str = "",
) -> tuple[str, int]:
    """Summarise an elastic ``ChildFailedError``: which ranks failed how; and the exit code to use.

    The first failure is the earliest one that is not a consequence of another rank's (a peer's
    closed connection), by the time the worker recorded it (see ``_failure_recorder.py``).
    When another machine went silent first (``silent``), that machine is the cause: ranks here
    that failed waiting (a timeout, a closed connection) are marked so, and none is called the
    first failure.

    Args:
        error: The ``ChildFailedError``.
        who: The command named in the summary.
        dumps: Rank -> position read from Flight Recorder dumps (NCCL), for ranks whose error
            file says nothing about their collectives.
        silent: The machines whose launchers went silent
            (:meth:`~accel_launch.runners.machines.MachineBoard.describe_silent`), or "".
    """
    failures = {rank: _rank_failure(rank, failure) for rank, failure in error.failures.items()}
    waited = {other for other, failure in failures.items() if silent and _waited(failure.text)}
    causes = [failure for other, failure in failures.items() if other not in waited]
    rank = first_failure(causes or list(failures.values())).rank
    first = error.failures[rank]
    lines = [f"{who}: the job failed."]
    if silent:
        lines[0] = (
            f"{who}: the job failed: {silent}: its launcher stopped answering (the machine is "
            "down or its network link is cut), and this machine's ranks failed waiting for it."
        )
    for global_rank, failure in sorted(error.failures.items()):
        how = (
            f"killed by {failure.signal_name()}"
            if failure.exitcode < 0
            else f"exited with code {failure.exitcode}"
        )
        if global_rank in waited:
            marker = "  (waited for the silent machine)"
        elif global_rank == rank:
            marker = "  (first failure)"
        elif failures[global_rank].secondary:
            marker = "  (a consequence: disconnected or stopped after a peer failed)"
        else:
            marker = ""
        lines.append(
            f"  rank {global_rank} (local rank {failure.local_rank}, pid {failure.pid}) {how}{marker}"
        )
    dumped = dumps or {}
    reported = {
        other: (_collectives(error.failures[other]) if other in error.failures else "")
        or dumped.get(other, "")
        for other in set(error.failures) | set(dumped)
    }
    if any(reported.values()):
        lines.append(f"Where the ranks were: {side_by_side(reported, reported)}")
    callstack = failures[rank].text
    if callstack:
        lines.append(f"Traceback of rank {rank}:")
        lines.append(callstack.rstrip())
    else:
        lines.append(f"The traceback of rank {rank}, if it raised, is printed above by the worker.")
    # A rank that raised and was then stopped by the agent's SIGTERM exits as Python would have.
    code = 1 if first.exitcode < 0 and callstack else _exit_code(first.exitcode)
    return "\n".join(lines), code


#: A worker's error that says it waited for others: a timeout, a lost peer, a stop.
_WAITED = re.compile(
    r"CollectiveTimeoutError|CollectiveFailedError|DistBackendError|DistNetworkError|"
    r"DistStoreError|[Tt]imed out|[Tt]imeout|stopped by SIGTERM"
)


def _waited(text: str) -> bool:
    """Whether a failure's text reads like waiting for other processes (or a consequence)."""
    return is_secondary_failure(text) or _WAITED.search(text) is not None


def _exit_code(worker_code: int) -> int:
    """The worker's own exit code, ``128 + signal`` for a signal, 1 when it gave none."""
    if worker_code < 0:
        return 128 - worker_code
    return worker_code if 0 < worker_code < 256 else 1


def run_elastic(plan: LaunchPlan) -> int:
    """Start the elastic agent for this machine and wait for the job; return the exit code."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    command = guarded(plan.python_command(record_failures=True))
    if not plan.quiet:
        where = (
            f" on machine {plan.machine_rank} of {plan.num_machines}"
            if plan.num_machines > 1
            else ""
        )
        if plan.num_machines > 1 and plan.rdzv_backend == "c10d":
            where = f" on one of {plan.num_machines} machines (c10d numbers them)"
        if plan.min_machines is not None:
            where = f" on one of {plan.min_machines} to {plan.num_machines} machines (elastic)"
        print(
            f"accel launch: starting {plan.nproc_per_node} process(es){where} "
            f"({plan.rdzv_backend} rendezvous at {plan.rdzv_endpoint}){_network_line(plan)}",
            file=sys.stderr,
            flush=True,
        )
    with (
        _log_dir(plan.log_dir) as log_dir,
        machine_board(plan) as board,
        extended_environ({**plan.env, **_recorder_env(plan, log_dir)}),
        _quiet(plan.quiet),
        _default_signals(),
    ):
        if board is not None:
            board.watch()
        try:
            elastic_launch(_launch_config(plan, log_dir), command[0])(*command[1:])
        except ChildFailedError as error:
            if board is not None:
                board.job_failed_here()
            silent = board.silent_machines() if board is not None else []
            summary, code = describe_failure(
                error,
                dumps=flight_recorder.positions(log_dir),
                silent=board.describe_silent(silent) if board is not None and silent else "",
            )
            print(summary, file=sys.stderr, flush=True)
            if board is not None:
                board.post_failure(summary)
            return code
        except SignalException as error:
            if board is not None and board.lost_machine:
                print(f"accel launch: the job failed: {board.lost_machine}.", file=sys.stderr)
                return 1
            if board is not None and board.peer_failure:
                return _stopped_for_peer(board.peer_failure)
            return _stopped_by(error.sigval)
        except Exception as error:
            if board is None or not _is_rendezvous_failure(error):
                raise
            print(board.describe_missing(error), file=sys.stderr, flush=True)
            return 1
    return 0


def _is_rendezvous_failure(error: BaseException) -> bool:
    """A store time-out or connection error, or an elastic rendezvous error."""
    from torch.distributed import DistError
    from torch.distributed.elastic.rendezvous import RendezvousError

    return isinstance(error, (DistError, RendezvousError, TimeoutError))


def _stopped_for_peer(failure: str) -> int:
    """This machine's workers were stopped because another machine's job failed: exit 1."""
    print(
        f"accel launch: another machine's job failed, so this machine's workers were stopped: "
        f"{failure}. Its own output has the traceback.",
        file=sys.stderr,
        flush=True,
    )
    return 1


def _network_line(plan: LaunchPlan) -> str:
    """``; network: eth0 (198.18.0.11), ...`` for a job on several machines, else nothing.

    A replica group on one machine whose lighthouse is elsewhere has its interface chosen too
    (the one that routes to the lighthouse): that is said as well.
    """
    if plan.num_machines == 1 and plan.interface is None:
        return ""
    if plan.interface is not None:
        return (
            f"; network: {plan.interface.describe()}, set as GLOO_SOCKET_IFNAME and "
            "NCCL_SOCKET_IFNAME (set one yourself to choose another)"
        )
    chosen = user_choice({**os.environ, **plan.env})
    if chosen:
        return "; network: " + ", ".join(f"{name}={value}" for name, value in chosen.items())
    return ""


def _recorder_env(plan: LaunchPlan, log_dir: str) -> dict[str, str]:
    """Torch's Flight Recorder, dumping into ``log_dir`` on an NCCL timeout (GPU jobs only)."""
    return flight_recorder.flight_recorder_env(log_dir) if plan.uses_gpus else {}


def _stopped_by(sigval: Any) -> int:
    """The exit code after a signal stopped the launcher: 75 for SIGTERM (requeue), else 128+n."""
    if sigval == signal.SIGTERM:
        print(
            "accel launch: got SIGTERM (preemption); it was forwarded to every worker, which had "
            f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds to save. Exiting with {REQUEUE_EXIT_CODE} so "
            "the scheduler requeues the job; a relaunch resumes from the newest checkpoint.",
            file=sys.stderr,
            flush=True,
        )
        return REQUEUE_EXIT_CODE
    print(
        f"accel launch: stopped by {sigval.name}; all workers were terminated.",
        file=sys.stderr,
        flush=True,
    )
    return 128 + int(sigval)
