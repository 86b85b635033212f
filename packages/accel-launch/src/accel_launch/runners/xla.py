"""XLA (TPU, or XLA on CPU/GPU) through torch_xla's own launcher, imported only here.

As with Accelerate, the script is imported (not run as ``__main__``) in every process and its
``main_training_function`` (default ``main``) is called without arguments; ``sys.argv`` holds the
script's arguments.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from accel_launch.errors import JobFailedError, LaunchArgumentError, MissingDependencyError
from accel_launch.plan import LaunchPlan
from accel_launch.runners.environ import extended_environ


class XlaEntry:
    """Picklable per-process entry point: import the target, call its training function."""

    def __init__(self, target: str, module: bool, function: str, argv: list[str]) -> None:
        self.target = target
        self.module = module
        self.function = function
        self.argv = argv

    def _import(self) -> ModuleType:
        if self.module:
            return importlib.import_module(self.target)
        path = Path(self.target).resolve()
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise LaunchArgumentError(f"cannot import the training script {self.target!r}.")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = loaded
        spec.loader.exec_module(loaded)
        return loaded

    def __call__(self, index: int) -> None:
        """Run in each XLA process; ``index`` is the process ordinal torch_xla passes."""
        sys.argv = [self.target, *self.argv]
        function = getattr(self._import(), self.function, None)
        if not callable(function):
            raise LaunchArgumentError(
                f"{self.target!r} has no function {self.function!r} to call on XLA; set "
                "--main_training_function (or main_training_function in the config)."
            )
        function()


def run_xla(plan: LaunchPlan) -> int:
    """Launch ``plan`` with ``torch_xla.distributed.xla_multiprocessing.spawn``."""
    if plan.no_python:
        raise LaunchArgumentError(
            "--no_python cannot be used with --tpu: XLA runs Python functions."
        )
    if importlib.util.find_spec("torch_xla") is None:
        raise MissingDependencyError(
            "--tpu (distributed_type XLA) needs torch_xla, which is not installed: "
            "pip install 'accel-launch[xla]' (or accel-state[xla]; torch_xla must match torch)."
        )
    import torch_xla.distributed.xla_multiprocessing as xmp

    env = dict(plan.env)
    env.setdefault("PJRT_DEVICE", os.environ.get("PJRT_DEVICE", "TPU"))
    if env["PJRT_DEVICE"].upper() == "CPU" and plan.num_processes:
        env.setdefault("CPU_NUM_DEVICES", str(plan.num_processes))
    entry = XlaEntry(plan.target, plan.module, plan.main_training_function, list(plan.target_args))
    nprocs = 1 if plan.num_processes == 1 else None
    with extended_environ(env):
        try:
            xmp.spawn(entry, args=(), nprocs=nprocs, start_method="spawn")
        except KeyboardInterrupt:
            return 130
        except Exception as error:
            raise JobFailedError(f"the XLA job failed: {error}") from error
    return 0
