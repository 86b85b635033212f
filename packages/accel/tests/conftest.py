import pytest


@pytest.fixture(autouse=True)
def clean_state(single_process_state):
    """Every in-process test runs as a plain single process with fresh shared state."""


@pytest.fixture
def repo_script(monkeypatch):
    """A loader: ``repo_script(name)`` imports ``scripts/<name>.py`` of this checkout as ``name``.

    Its sibling scripts import beside it (the folder is put on ``sys.path`` for the test).
    """
    import importlib.util
    import pathlib
    import sys

    folder = pathlib.Path(__file__).resolve().parents[3] / "scripts"
    monkeypatch.syspath_prepend(str(folder))

    def load(name):
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def coverage_script(repo_script):
    """``scripts/api_coverage.py`` of this checkout, imported as the module ``api_coverage``.

    Its reasons module (``scripts/api_coverage_reasons.py``) is imported beside it.
    """
    return repo_script("api_coverage")
