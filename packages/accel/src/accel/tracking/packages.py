"""Tracker names accel knows a package for, whether it is installed, and importing it.

A tracker imports its package when it is created (:func:`import_tracker_package`), never when
``accel`` is imported; a missing package gives an error naming what to ``pip install``.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

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


def import_tracker_package(name: str) -> ModuleType:
    """Import the package behind the tracker called ``name``.

    Raises:
        UnsupportedFeatureError: The package is not installed (the message says what to install).
    """
    if not tracker_package_available(name):
        raise missing_package_error(name)
    return importlib.import_module(TRACKER_PACKAGES[name][0])
