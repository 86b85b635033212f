"""The ``torch>=`` every package declares is the oldest torch ``nox -s torch_versions`` tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ["accel-state", "accel-ops", "accel-data", "accel-ckpt", "accel-launch", "accel"]


def _pinned_torch(name: str) -> str:
    text = (ROOT / "constraints" / f"torch-{name}.txt").read_text()
    match = re.search(r"^torch==([0-9.]+)$", text, flags=re.MULTILINE)
    assert match, f"constraints/torch-{name}.txt pins no torch"
    return match.group(1)


@pytest.mark.parametrize("package", PACKAGES)
def test_declared_bound_is_the_oldest_torch_tested(package: str) -> None:
    pyproject = ROOT / "packages" / package / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("not run from a checkout of the repository (no packages/ beside the tests)")
    # A regular expression, not tomllib: the package supports Python 3.10.
    line = re.search(r"^dependencies = \[(.*)\]$", pyproject.read_text(), flags=re.MULTILINE)
    assert line, f"{pyproject} has no one-line dependencies list"
    bounds = re.findall(r'"(torch>=[0-9.]+)"', line.group(1))
    assert len(bounds) == 1, f"{package} declares torch as {line.group(1)}, not one torch>=X"
    oldest = _pinned_torch("oldest")
    assert bounds[0].split(">=")[1].strip() == ".".join(oldest.split(".")[:2]), (
        f"{package} declares {bounds[0]}, but nox -s torch_versions tests torch=={oldest} "
        "(constraints/torch-oldest.txt)"
    )


def test_the_newest_torch_tested_is_newer_than_the_oldest() -> None:
    def key(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.split("."))

    assert key(_pinned_torch("newest")) > key(_pinned_torch("oldest"))
