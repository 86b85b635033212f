"""pytest plugin: the ``cuda`` and ``xla`` markers, skipped with a reason when the hardware is absent.

Enable with ``-p accel_state.testing.pytest_plugin``. ``@pytest.mark.cuda`` needs one GPU;
``@pytest.mark.cuda(min_gpus=2)`` needs two. ``@pytest.mark.xla`` needs torch_xla (one XLA
device: ``PJRT_DEVICE=CPU`` will do); ``@pytest.mark.xla(min_devices=2)`` needs several real XLA
devices (a TPU VM). The ``single_process_state`` fixture runs a test as a plain process with fresh
accel state; ``xla_state`` does the same on the XLA device.
``@pytest.mark.torch_feature("fsdp2")`` skips a test on a torch older than the feature gate of
that key (``accel_state.torch_compat.GATES``) needs, with the gate's message as the reason.

Multi-process jobs of :func:`~accel_state.testing.spawn_workers` run on shared, long-lived worker
pools during the run (closed at its end); ``--accel-fresh-workers`` starts fresh processes for
every job instead.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from accel_state.testing.environ import without_launcher_variables
from accel_state.testing.pool import SHARED_POOLS

#: ``PJRT_DEVICE`` as the test session started (fixtures strip it from single-process tests).
_SESSION_PJRT_DEVICE: str | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--accel-fresh-workers``."""
    parser.addoption(
        "--accel-fresh-workers",
        action="store_true",
        default=False,
        help="start fresh processes for every spawn_workers job instead of reusing a pool",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers, remember the session's ``PJRT_DEVICE``, switch worker reuse on."""
    global _SESSION_PJRT_DEVICE
    _SESSION_PJRT_DEVICE = os.environ.get("PJRT_DEVICE")
    SHARED_POOLS.enabled = not config.getoption("--accel-fresh-workers")
    config.addinivalue_line("markers", "cuda(min_gpus=1): needs CUDA GPUs; skipped without them")
    config.addinivalue_line(
        "markers",
        "xla(min_devices=1): needs torch_xla, and min_devices XLA devices (more than one: real "
        "TPUs); skipped without them",
    )
    config.addinivalue_line(
        "markers",
        "torch_feature(*keys): needs the torch release each feature gate names "
        "(accel_state.torch_compat.GATES); skipped with the gate's message on older torch",
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the shared worker pools."""
    SHARED_POOLS.close_all()
    SHARED_POOLS.enabled = False


def _cuda_skip_reason(min_gpus: int) -> str | None:
    import torch

    if not torch.cuda.is_available():
        return f"needs {min_gpus} CUDA GPU(s); this torch ({torch.__version__}) sees none"
    count = torch.cuda.device_count()
    if count < min_gpus:
        return f"needs {min_gpus} CUDA GPU(s); found {count}"
    return None


@functools.cache
def xla_device_count(pjrt_device: str) -> int:
    """XLA devices of the whole job on ``pjrt_device``, counted in a child process.

    A child, so that this process never opens the runtime (a TPU is held by one process at a
    time, and the tests start their own). 0 when the runtime cannot start.
    """
    code = "import torch_xla.runtime as xr; print(xr.global_runtime_device_count())"
    environ = {**os.environ, "PJRT_DEVICE": pjrt_device}
    try:
        result = subprocess.run(
            [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=300
        )
        return int(result.stdout.strip().splitlines()[-1]) if result.returncode == 0 else 0
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return 0


def _xla_skip_reason(min_devices: int) -> str | None:
    if importlib.util.find_spec("torch_xla") is None:
        return "needs torch_xla (run the xla leg: nox -s tests(package=..., backend='xla'))"
    if min_devices <= 1:
        return None
    pjrt = _SESSION_PJRT_DEVICE or ""
    if pjrt.upper() in ("", "CPU"):
        return (
            f"needs {min_devices} XLA devices (a TPU VM with PJRT_DEVICE=TPU); "
            f"PJRT_DEVICE={pjrt or '(unset)'} gives one here, and torch_xla 2.9 runs several CPU "
            "devices as threads of one process whose collectives do not rendezvous"
        )
    count = xla_device_count(pjrt)
    if count < min_devices:
        return f"needs {min_devices} XLA devices; PJRT_DEVICE={pjrt} has {count}"
    return None


def torch_feature_skip_reason(*keys: str) -> str | None:
    """The message of the first gate among ``keys`` that the running torch does not pass on the CPU.

    Raises:
        KeyError: A key names no gate (a typo in a test's marker).
    """
    from accel_state.torch_compat import GATES

    for key in keys:
        if key not in GATES:
            raise KeyError(f"torch_feature({key!r}): no such gate; known: {sorted(GATES)}")
        if not GATES[key].available(device_type="cpu"):  # the test legs run on the CPU
            return GATES[key].message(device_type="cpu")
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip marked tests whose hardware, library or torch release is missing, saying why."""
    for marker in item.iter_markers("torch_feature"):
        reason = torch_feature_skip_reason(*marker.args)
        if reason:
            pytest.skip(reason)
    cuda = item.get_closest_marker("cuda")
    if cuda is not None:
        reason = _cuda_skip_reason(int(cuda.kwargs.get("min_gpus", 1)))
        if reason:
            pytest.skip(reason)
    xla = item.get_closest_marker("xla")
    if xla is not None:
        reason = _xla_skip_reason(int(xla.kwargs.get("min_devices", 1)))
        if reason:
            pytest.skip(reason)


@pytest.fixture
def single_process_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run the test as a plain single process: no launcher or ``ACCEL_*`` variables, fresh state."""
    from accel_state.shared import reset_state

    keep = without_launcher_variables(os.environ)
    for name in list(os.environ):
        if name not in keep:
            monkeypatch.delenv(name)
    reset_state()
    yield
    reset_state()


@pytest.fixture
def xla_state(single_process_state: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """One plain process on the XLA device: ``PJRT_DEVICE`` as the session had it (default CPU)."""
    from accel_state.shared import reset_state

    monkeypatch.setenv("PJRT_DEVICE", _SESSION_PJRT_DEVICE or "CPU")
    reset_state()
    yield
    reset_state()
