"""Tracker names accel knows, the package each needs, and the errors when one is missing.

Shared by :mod:`accel.tracking` (which resolves ``log_with``) and :mod:`accel.hosted_trackers`
(which drives wandb and MLflow); imports neither, nor any tracker package.
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

#: Names accel recognises but has no built-in tracker for.
UNIMPLEMENTED_TRACKERS = ("comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio")


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


def unimplemented_error(name: str) -> UnsupportedFeatureError:
    """The error for a tracker name accel knows but does not implement."""
    module, install = TRACKER_PACKAGES[name]
    missing = (
        ""
        if tracker_package_available(name)
        else f" The {module} package is not installed either (pip install {install})."
    )
    return UnsupportedFeatureError(
        f"log_with={name!r}: accel has no built-in {name} tracker (built in: jsonl, csv, "
        "tensorboard, wandb, mlflow). Subclass accel.GeneralTracker to drive it and pass an "
        f"instance in log_with (see the accel README, 'Experiment trackers').{missing}"
    )
