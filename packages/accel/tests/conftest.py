import pytest


@pytest.fixture(autouse=True)
def clean_state(single_process_state):
    """Every in-process test runs as a plain single process with fresh shared state."""


@pytest.fixture
def coverage_script(monkeypatch):
    """``scripts/api_coverage.py`` of this checkout, imported as the module ``api_coverage``.

    Its reasons module (``scripts/api_coverage_reasons.py``) is imported beside it.
    """
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).resolve().parents[3] / "scripts" / "api_coverage.py"
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location("api_coverage", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
