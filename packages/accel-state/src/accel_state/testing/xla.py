"""Run a function once per XLA device through torch_xla's launcher, from a child process.

The launcher (``torch_xla.distributed.xla_multiprocessing.spawn``) runs in a child so that the
calling process (a test session) never opens the XLA runtime: a TPU is held by one process at a
time. Each replica pickles its return value into a shared folder, named by its global ordinal.

Run as ``python -m accel_state.testing.xla FOLDER`` by :func:`spawn_xla_workers` only.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from accel_state.testing.workers import WorkerFailedError, WorkersTimedOutError

_REQUEST = "request.pkl"


def spawn_xla_workers(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    timeout: float = 600.0,
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """Run ``function(*args)`` on every XLA device of this machine (one replica each).

    ``function`` must be importable (module level): it travels pickled by reference. The child
    gets this process's environment (plus ``env``) and its ``sys.path``.

    Args:
        function: Module-level callable run by every replica.
        args: Its positional arguments (picklable).
        timeout: Seconds before the child and its replicas are killed.
        env: Extra environment variables, e.g. ``{"PJRT_DEVICE": "TPU"}``.

    Returns:
        The return values, indexed by global ordinal (one per device).

    Raises:
        WorkerFailedError: A replica raised, or the launcher failed; the message has its output.
        WorkersTimedOutError: The replicas did not finish within ``timeout`` seconds.

    """
    with tempfile.TemporaryDirectory(prefix="accel-xla-") as folder:
        Path(folder, _REQUEST).write_bytes(pickle.dumps((function, args)))
        environ = {**os.environ, **(env or {})}
        environ["PYTHONPATH"] = os.pathsep.join(entry for entry in sys.path if entry)
        process = subprocess.Popen(
            [sys.executable, "-m", "accel_state.testing.xla", folder],
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            raise WorkersTimedOutError(
                f"The XLA replicas did not finish within {timeout:.0f} s; killed. Output:\n"
                f"{output[-4000:]}"
            ) from None
        if process.returncode != 0:
            raise WorkerFailedError(
                f"The XLA replicas failed (launcher exit code {process.returncode}):\n"
                f"{output[-8000:]}"
            )
        return _results(Path(folder), output)


def _results(folder: Path, output: str) -> list[Any]:
    values = {
        int(path.stem.removeprefix("result_")): pickle.loads(path.read_bytes())
        for path in folder.glob("result_*.pkl")
    }
    if sorted(values) != list(range(len(values))) or not values:
        raise WorkerFailedError(
            f"The XLA replicas reported ordinals {sorted(values)}, not 0..N-1. Output:\n"
            f"{output[-4000:]}"
        )
    return [values[ordinal] for ordinal in range(len(values))]


def _replica(index: int, folder: str) -> None:
    """One replica: run the requested function, store its value under the global ordinal."""
    import torch_xla.runtime as xr

    function, args = pickle.loads(Path(folder, _REQUEST).read_bytes())
    value = function(*args)
    Path(folder, f"result_{xr.global_ordinal()}.pkl").write_bytes(pickle.dumps(value))


def main(folder: str) -> None:
    """Start one replica per XLA device (torch_xla's launcher), each running :func:`_replica`."""
    import torch_xla.distributed.xla_multiprocessing as xmp

    xmp.spawn(_replica, args=(folder,), start_method="spawn")


if __name__ == "__main__":
    main(sys.argv[1])
