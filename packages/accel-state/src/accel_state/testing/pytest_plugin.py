"""pytest plugin: the ``cuda`` and ``xla`` markers, skipped with a reason when the hardware is absent.

Enable with ``-p accel_state.testing.pytest_plugin``. ``@pytest.mark.cuda`` needs one GPU;
``@pytest.mark.cuda(min_gpus=2)`` needs two. ``@pytest.mark.xla`` needs torch_xla. The
``single_process_state`` fixture runs a test as a plain process with fresh accel state.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

from accel_state.testing.environ import without_launcher_variables


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers."""
    config.addinivalue_line("markers", "cuda(min_gpus=1): needs CUDA GPUs; skipped without them")
    config.addinivalue_line("markers", "xla: needs torch_xla; skipped without it")


def _cuda_skip_reason(min_gpus: int) -> str | None:
    import torch

    if not torch.cuda.is_available():
        return f"needs {min_gpus} CUDA GPU(s); this torch ({torch.__version__}) sees none"
    count = torch.cuda.device_count()
    if count < min_gpus:
        return f"needs {min_gpus} CUDA GPU(s); found {count}"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip marked tests whose hardware or library is missing, saying why."""
    cuda = item.get_closest_marker("cuda")
    if cuda is not None:
        reason = _cuda_skip_reason(int(cuda.kwargs.get("min_gpus", 1)))
        if reason:
            pytest.skip(reason)
    if item.get_closest_marker("xla") is not None and importlib.util.find_spec("torch_xla") is None:
        pytest.skip("needs torch_xla (run the xla leg: nox -s tests(package=..., backend='xla'))")


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
