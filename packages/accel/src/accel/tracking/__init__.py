"""Experiment trackers (Accelerate's ``accelerate.tracking``): this module only re-exports.

The code lives in one module per job: :mod:`~accel.tracking.base` (``GeneralTracker``,
``LoggerType``, ``on_main_process``), :mod:`~accel.tracking.local` (JSON lines, CSV,
TensorBoard), :mod:`~accel.tracking.hosted` (W&B, MLflow), :mod:`~accel.tracking.services`
(Comet, Aim, ClearML, DVCLive, SwanLab, Trackio), :mod:`~accel.tracking.packages` (each
tracker's package), :mod:`~accel.tracking.registry` (:data:`LOGGER_TYPE_TO_CLASS`, the one
registry of tracker classes by name), :mod:`~accel.tracking.resolve` (``log_with`` -> trackers)
and :mod:`~accel.tracking.accelerator_mixin` (the Accelerator's tracker methods). A tracker's
package is imported when the tracker is created, so ``import accel`` imports no tracker package.
"""

from accel.tracking.base import GeneralTracker, LoggerType, on_main_process
from accel.tracking.hosted import MLflowTracker, WandBTracker
from accel.tracking.local import (
    CSVTracker,
    JSONLinesTracker,
    TensorBoardTracker,
    tensorboard_available,
)
from accel.tracking.packages import (
    TRACKER_PACKAGES,
    missing_package_error,
    tracker_package_available,
)
from accel.tracking.registry import LOGGER_TYPE_TO_CLASS, register_tracker_class, tracker_class
from accel.tracking.resolve import (
    check_logging_directory,
    filter_trackers,
    get_available_trackers,
    resolve_trackers,
)
from accel.tracking.services import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    SwanLabTracker,
    TrackioTracker,
)

#: Accelerate's ``accelerate.tracking`` names (``import *``); the helpers imported above
#: (``TRACKER_PACKAGES``, ``tracker_class``, ``check_logging_directory``...) stay importable here.
__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "CSVTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "JSONLinesTracker",
    "LoggerType",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "get_available_trackers",
    "on_main_process",
    "register_tracker_class",
    "resolve_trackers",
]
