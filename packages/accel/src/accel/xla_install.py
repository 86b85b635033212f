"""Accelerate's ``accelerate.utils.torch_xla`` path: ``install_xla``.

Accelerate's helper downloads a Colab-only torch_xla wheel built for Python 3.7, which no
longer exists; accel refuses it with the command to run instead.
"""

from __future__ import annotations

import importlib.metadata

from accel.errors import UnsupportedFeatureError


def install_xla(upgrade: bool = False) -> None:
    """Refuse, naming the pip command that installs torch_xla for the installed torch.

    Args:
        upgrade: Accelerate's flag to upgrade torch first (named in the message).

    Raises:
        UnsupportedFeatureError: Always: accel does not install packages.
    """
    torch_version = importlib.metadata.version("torch").split("+")[0]
    major_minor = ".".join(torch_version.split(".")[:2])
    upgrade_hint = "pip install -U torch && " if upgrade else ""
    raise UnsupportedFeatureError(
        "install_xla(): accel does not install packages (Accelerate's helper fetched a Colab "
        "wheel for Python 3.7 that no longer exists). Install torch_xla matching torch "
        f"{torch_version} yourself: {upgrade_hint}pip install 'torch_xla[tpu]~={major_minor}.0'."
    )


__all__ = ["install_xla"]
