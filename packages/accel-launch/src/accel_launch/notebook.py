"""Launch a function on several processes from a live interpreter (a notebook, a REPL, a test).

Workers are forked by PyTorch's elastic agent (``start_method="fork"``), so the function and its
arguments need not be picklable, and everything defined in the notebook is visible to them. CUDA must
not be initialised in the parent before forking: create models and the Accelerator inside the
function only.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from accel_launch.errors import JobFailedError, NotebookLaunchError
from accel_launch.runners.environ import extended_environ
from accel_state.contract import LaunchContract
from accel_state.errors import EnvironmentConfigError
from accel_state.types import PrecisionType

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
    node_rank: int,
    master_addr: str,
    port: int,
    max_restarts: int,
    env: dict[str, str],
) -> None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from accel_launch.runners.elastic import describe_failure

    with (
        tempfile.TemporaryDirectory(prefix="accel_notebook_") as log_dir,
        extended_environ(env),
        _restored_signal_handlers(),
    ):
        config = LaunchConfig(
            min_nodes=num_nodes,
            max_nodes=num_nodes,
            nproc_per_node=num_processes,
            logs_specs=DefaultLogsSpecs(log_dir=log_dir),
            run_id=uuid.uuid4().hex if num_nodes == 1 else "accel_notebook",
            rdzv_endpoint=f"{master_addr}:{port}",
            rdzv_backend="static",
            rdzv_configs={"rank": node_rank},
            max_restarts=max_restarts,
            monitor_interval=0.1,
            start_method="fork",
        )
        try:
            elastic_launch(config, function)(*args)
        except ChildFailedError as error:
            summary, code = describe_failure(error, "notebook_launcher")
            raise JobFailedError(summary, code) from None
        except SignalException as error:
            raise KeyboardInterrupt(f"stopped by {error.sigval.name}") from None


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
    use_port: str | int = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    max_restarts: int = 0,
) -> None:
    """Run ``function(*args)`` on ``num_processes`` forked processes of this machine.

    Args:
        function: The training function; build the model and ``Accelerator`` inside it.
        args: Its positional arguments.
        num_processes: Processes on this machine; default: every GPU, or 1 without GPUs.
        mixed_precision: ``no``, ``fp16``, ``bf16`` or ``fp8``, handed to the workers.
        use_port: Rendezvous port on ``master_addr`` (node 0 listens there).
        master_addr: Address of node 0.
        node_rank: Index of this machine.
        num_nodes: Machines taking part (run the same cell on each).
        max_restarts: Times the group is restarted after a failure.

    Raises:
        NotebookLaunchError: CUDA is already initialised here, or an argument is invalid.
        JobFailedError: A worker failed (the message holds its rank and traceback).
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
        + ".",
        file=sys.stderr,
    )
    _fork_launch(
        function,
        args,
        num_processes=num_processes,
        num_nodes=num_nodes,
        node_rank=node_rank,
        master_addr=master_addr,
        port=_port(use_port),
        max_restarts=max_restarts,
        env=env,
    )


def debug_launcher(
    function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int = 2
) -> None:
    """Run ``function(*args)`` on ``num_processes`` forked CPU processes (to debug distributed code).

    Raises:
        JobFailedError: A worker failed (the message holds its rank and traceback).
    """
    from accel_state.testing.ports import find_free_port

    if num_processes < 1:
        raise NotebookLaunchError(f"num_processes={num_processes} must be >= 1.")
    _fork_launch(
        function,
        args,
        num_processes=num_processes,
        num_nodes=1,
        node_rank=0,
        master_addr="127.0.0.1",
        port=find_free_port(),
        max_restarts=0,
        env={**_contract_env("no", use_cpu=True), "OMP_NUM_THREADS": "1"},
    )
