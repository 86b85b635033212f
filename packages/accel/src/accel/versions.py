"""Accelerate's ``accelerate.utils.versions``: compare installed library versions.

Example:
    >>> from accel.utils.versions import compare_versions
    >>> compare_versions("2.1.0", ">=", "2.0")
    True
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import torch
from torch.torch_version import TorchVersion

from accel.availability import is_torch_version
from accel.constants import STR_OPERATION_TO_FUNC

#: The installed torch version (compares with version strings: ``torch_version >= "2.4"``).
torch_version = TorchVersion(torch.__version__)


def compare_versions(library_or_version: Any, operation: str, requirement_version: str) -> bool:
    """Compare a library's installed version (or a version) with ``requirement_version``.

    Args:
        library_or_version: A distribution name (``"torch"``), a version string or a parsed
            version; a string that names an installed distribution is read as that name.
        operation: One of ``> >= == != <= <``.
        requirement_version: The version to compare with.

    Raises:
        ValueError: ``operation`` is not one of the six comparisons.
        importlib.metadata.PackageNotFoundError: A name that is neither installed nor a version.
    """
    compare = STR_OPERATION_TO_FUNC.get(operation)
    if compare is None:
        raise ValueError(
            f"compare_versions(operation={operation!r}): use one of "
            f"{', '.join(STR_OPERATION_TO_FUNC)}."
        )
    version = str(library_or_version)
    if isinstance(library_or_version, str) and not version[:1].isdigit():
        version = importlib.metadata.version(library_or_version)
    return bool(compare(TorchVersion(version), requirement_version))


__all__ = ["compare_versions", "is_torch_version", "torch_version"]
