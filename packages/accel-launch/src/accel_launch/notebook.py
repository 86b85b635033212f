"""Launch a function on several processes from a live interpreter (a notebook, a REPL, a test).

Workers are forked by PyTorch's elastic agent (``start_method="fork"``), so the function and its
arguments need not be picklable, and everything defined in the notebook is visible to them. CUDA must
not be initialised in the parent before forking: create models and the Accelerator inside the
function only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import signal
import socket
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from accel_launch.errors import NotebookLaunchError
from accel_launch.runners.environ import extended_environ
from accel_state.contract import LaunchContract
from accel_state.errors import EnvironmentConfigError
from accel_state.types import PrecisionType

DEFAULT_MULTI_NODE_PORT = 29500
_AGENT_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


@contextlib.contextmanager
def _restored_signal_handlers() -> Iterator[None]:
    """The elastic agent installs its own handlers; give the interpreter its own back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = [getattr(signal, name) for name in _AGENT_SIGNALS if hasattr(signal, name)]
    saved = {number: signal.getsignal(number) for number in numbers}
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


def _contract_env(mixed_precision: str, use_cpu: bool) -> dict[str, str]:
    try:
        precision = PrecisionType(mixed_precision)
        return LaunchContract(mixed_precision=precision, use_cpu=use_cpu).to_env()
    except (ValueError, EnvironmentConfigError):
        raise NotebookLaunchError(
            f"mixed_precision={mixed_precision!r} is not valid; choose one of "
            f"{', '.join(PrecisionType.list())}."
        ) from None


def _fork_launch(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    num_processes: int,
    num_nodes: int,
    rendezvous: _Rendezvous,
    max_restarts: int,
    monitor_interval: float,
    log_line_prefix_template: str | None,
    env: dict[str, str],
) -> None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from accel_launch._notebook_failure import NotebookJobFailedError
    from accel_launch._notebook_peers import notebook_worker
    from accel_launch.runners.elastic import describe_failure

    with (
        tempfile.TemporaryDirectory(prefix="accel_notebook_") as log_dir,
        tempfile.TemporaryDirectory(prefix="accel_notebook_departures_") as departures,
        extended_environ({**env, "FORK_LAUNCHED": "1"}),  # PartialState().fork_launched
        _restored_signal_handlers(),
    ):
        config = LaunchConfig(
            min_nodes=num_nodes,
            max_nodes=num_nodes,
            nproc_per_node=num_processes,
            logs_specs=DefaultLogsSpecs(log_dir=log_dir),
            run_id=rendezvous.run_id,
            rdzv_endpoint=rendezvous.endpoint,
            rdzv_backend=rendezvous.backend,
            rdzv_configs=rendezvous.conf,
            max_restarts=max_restarts,
            monitor_interval=monitor_interval,
            start_method="fork",
            log_line_prefix_template=log_line_prefix_template,
        )
        try:
            elastic_launch(config, notebook_worker(function, pathlib.Path(departures)))(*args)
        except ChildFailedError as error:
            summary, code = describe_failure(error, "notebook_launcher")
            raise NotebookJobFailedError(error, summary, code) from None
        except SignalException as error:
            raise KeyboardInterrupt(f"stopped by {error.sigval.name}") from None


@dataclasses.dataclass(frozen=True)
class _Rendezvous:
    backend: str
    endpoint: str
    conf: dict[str, Any]
    run_id: str


def _rendezvous(
    *,
    rdzv_backend: str,
    rdzv_endpoint: str,
    rdzv_conf: dict[str, Any] | None,
    rdzv_id: str,
    use_port: str | int | None,
    master_addr: str,
    node_rank: int,
    num_nodes: int,
) -> _Rendezvous:
    """Accelerate's rendezvous arguments, resolved; a free port when one machine names none."""
    if rdzv_backend not in ("static", "c10d"):
        raise NotebookLaunchError(
            f"rdzv_backend={rdzv_backend!r} is not supported; use 'static' or 'c10d'."
        )
    conf = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        conf["rank"] = node_rank
    if not rdzv_endpoint:
        if use_port is None and num_nodes == 1:
            # c10d binds port 0 and shares what the OS gave; static needs a number up front.
            port = 0 if rdzv_backend == "c10d" else get_free_port()
        elif use_port is None:
            port = DEFAULT_MULTI_NODE_PORT  # every machine must agree on it: Accelerate's default
        else:
            port = _port(use_port)
        rdzv_endpoint = f"{master_addr}:{port}"
    if rdzv_id == "none" and num_nodes == 1:
        rdzv_id = uuid.uuid4().hex  # a fresh job id, so that no other job's store is joined
    return _Rendezvous(rdzv_backend, rdzv_endpoint, conf, rdzv_id)


def get_free_port() -> int:
    """A TCP port the OS reports free on every interface (another job's port never is).

    Accelerate's ``accelerate.utils.get_free_port`` (for ``main_process_port=0``).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _port(use_port: str | int) -> int:
    try:
        port = int(use_port)
    except (TypeError, ValueError):
        port = -1
    if not 0 < port < 65536:
        raise NotebookLaunchError(f"use_port={use_port!r} is not a TCP port (1-65535).")
    return port


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int | None = None,
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Run ``function(*args)`` on ``num_processes`` forked processes of this machine.

    Args:
        function: The training function; build the model and ``Accelerator`` inside it.
        args: Its positional arguments.
        num_processes: Processes on this machine; default: every GPU, or 1 without GPUs.
        mixed_precision: ``no``, ``fp16``, ``bf16`` or ``fp8``, handed to the workers.
        use_port: Rendezvous port on ``master_addr``. Default on one machine: a free port, so
            two launches never collide; on several machines 29500 (all must agree).
        master_addr: Address of node 0.
        node_rank: Index of this machine.
        num_nodes: Machines taking part (run the same cell on each).
        rdzv_backend: ``"static"`` (default) or ``"c10d"``.
        rdzv_endpoint: ``host:port`` of the rendezvous (default ``master_addr:use_port``).
        rdzv_conf: Extra rendezvous settings (``{"timeout": 60}``...).
        rdzv_id: The job id shared by every machine (one machine: a fresh one).
        max_restarts: Times the group is restarted after a failure.
        monitor_interval: Seconds between the agent's checks of the workers.
        log_line_prefix_template: Prefix of every worker output line, e.g.
            ``"[${role_name}${local_rank}]:"`` (torch elastic's template).

    Raises:
        NotebookLaunchError: CUDA is already initialised here, or an argument is invalid.
        ChildFailedError: A worker failed; the error (an ``accel_launch.JobFailedError`` too)
            names the failed ranks and holds the first one's traceback.
    """
    import torch

    if num_nodes < 1 or not 0 <= node_rank < num_nodes:
        raise NotebookLaunchError(
            f"node_rank={node_rank} must be in [0, num_nodes={num_nodes}) and num_nodes >= 1."
        )
    gpus = torch.cuda.device_count()
    if num_processes is None:
        num_processes = max(1, gpus)
    if num_processes < 1:
        raise NotebookLaunchError(f"num_processes={num_processes} must be >= 1.")
    if monitor_interval <= 0:
        raise NotebookLaunchError(f"monitor_interval={monitor_interval} must be > 0 seconds.")
    rendezvous = _rendezvous(
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_conf=rdzv_conf,
        rdzv_id=rdzv_id,
        use_port=use_port,
        master_addr=master_addr,
        node_rank=node_rank,
        num_nodes=num_nodes,
    )
    use_cpu = gpus == 0
    env = _contract_env(mixed_precision, use_cpu)
    if num_processes == 1 and num_nodes == 1 and max_restarts == 0:
        where = "CPU" if use_cpu else "one GPU"
        print(f"Launching training on {where}.", file=sys.stderr)
        with extended_environ(env):
            function(*args)
        return
    if not use_cpu and torch.cuda.is_initialized():
        raise NotebookLaunchError(
            "CUDA was initialised in this interpreter before notebook_launcher, so workers cannot "
            "be forked. Restart the kernel and make sure no cell touches CUDA (moving tensors or "
            "models to the GPU, creating an Accelerator) before the launch; do it inside the "
            "training function instead."
        )
    device = "CPU" if use_cpu else "GPU"
    print(
        f"Launching training on {num_processes} {device} process(es)"
        + (f" on node {node_rank} of {num_nodes}" if num_nodes > 1 else "")
        + f" (rendezvous {rendezvous.endpoint}).",
        file=sys.stderr,
    )
    _fork_launch(
        function,
        args,
        num_processes=num_processes,
        num_nodes=num_nodes,
        rendezvous=rendezvous,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        log_line_prefix_template=log_line_prefix_template,
        env=env,
    )


def test_launch() -> None:
    """Check that a ``PartialState`` starts in this process (what a launched function first does).

    Accelerate's ``accelerate.launchers.test_launch``.
    """
    from accel_state import PartialState

    PartialState()


def debug_launcher(
    function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int = 2
) -> None:
    """Run ``function(*args)`` on ``num_processes`` forked CPU processes (to debug distributed code).

    Raises:
        ChildFailedError: A worker failed (see :func:`notebook_launcher`).
    """
    if num_processes < 1:
        raise NotebookLaunchError(f"num_processes={num_processes} must be >= 1.")
    _fork_launch(
        function,
        args,
        num_processes=num_processes,
        num_nodes=1,
        rendezvous=_rendezvous(
            rdzv_backend="static",
            rdzv_endpoint="",
            rdzv_conf=None,
            rdzv_id="none",
            use_port=None,
            master_addr="127.0.0.1",
            node_rank=0,
            num_nodes=1,
        ),
        max_restarts=0,
        monitor_interval=0.1,
        log_line_prefix_template=None,
        env={**_contract_env("no", use_cpu=True), "OMP_NUM_THREADS": "1"},
    )
