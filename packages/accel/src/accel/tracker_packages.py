"""Tracker names accel knows, the package each needs, and the errors when one is missing.

Shared by :mod:`accel.tracking` (which resolves ``log_with``) and the modules holding the
trackers for third-party services; imports none of them, nor any tracker package.
"""

from __future__ import annotations

import importlib.util

from accel.errors import UnsupportedFeatureError

#: ``log_with`` name -> (module to import, what to ``pip install``).
TRACKER_PACKAGES: dict[str, tuple[str, str]] = {
    "wandb": ("wandb", "'accel[wandb]'"),
    "mlflow": ("mlflow", "'accel[mlflow]'"),
    "comet_ml": ("comet_ml", "comet_ml"),
    "aim": ("aim", "aim"),
    "clearml": ("clearml", "clearml"),
    "dvclive": ("dvclive", "dvclive"),
    "swanlab": ("swanlab", "swanlab"),
    "trackio": ("trackio", "trackio"),
}


def tracker_package_available(name: str) -> bool:
    """Whether the package behind the tracker called ``name`` is installed."""
    module = TRACKER_PACKAGES[name][0]
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_package_error(name: str) -> UnsupportedFeatureError:
    """The error for ``log_with=name`` when its package is not installed."""
    module, install = TRACKER_PACKAGES[name]
    return UnsupportedFeatureError(
        f"log_with={name!r} needs the {module} package, which is not installed: "
        f"pip install {install}."
    )
