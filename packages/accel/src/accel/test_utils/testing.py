"""Skip decorators, launch commands and cross-process checks for users' tests."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import torch

import accel_ops
from accel.availability import (
    is_aim_available,
    is_bnb_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_fp8_available,
    is_fp16_available,
    is_habana_gaudi1,
    is_hpu_available,
    is_import_timer_available,
    is_matplotlib_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_pandas_available,
    is_peft_available,
    is_pippy_available,
    is_pytest_available,
    is_schedulefree_available,
    is_sdaa_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_timm_available,
    is_torch_version,
    is_torch_xla_available,
    is_torchao_available,
    is_torchdata_stateful_dataloader_available,
    is_torchvision_available,
    is_trackio_available,
    is_transformer_engine_available,
    is_transformer_engine_mxfp8_available,
    is_transformers_available,
    is_triton_available,
    is_wandb_available,
    is_xpu_available,
)
from accel.test_utils.requirements import (
    require_aim,
    require_bnb,
    require_clearml,
    require_comet_ml,
    require_cuda_or_hpu,
    require_cuda_or_xpu,
    require_datasets,
    require_deepspeed,
    require_dvclive,
    require_fp8,
    require_fsdp2,
    require_huggingface_suite,
    require_import_timer,
    require_matplotlib,
    require_mlflow,
    require_mlu,
    require_multi_gpu_or_xpu,
    require_multi_xpu,
    require_musa,
    require_neuron,
    require_non_hpu,
    require_non_xpu,
    require_npu,
    require_pandas,
    require_peft,
    require_pippy,
    require_schedulefree,
    require_sdaa,
    require_single_xpu,
    require_swanlab,
    require_tensorboard,
    require_timm,
    require_torchao,
    require_torchdata_stateful_dataloader,
    require_tp,
    require_trackers,
    require_trackio,
    require_transformer_engine,
    require_transformer_engine_mxfp8,
    require_transformers,
    require_triton,
    require_wandb,
)
from accel_state.envvars import str_to_bool
from accel_state.testing.ports import find_free_port

# Accelerate's ``testing`` module namespace holds these availability checks too (its tests import
# ``is_hpu_available`` from it): they are the same objects as ``accel.utils``'s.
__all__ = [
    "DEFAULT_LAUNCH_COMMAND",
    "AccelerateTestCase",
    "MockingTestCase",
    "SubprocessCallException",
    "SubprocessRunOutput",
    "TempDirTestCase",
    "are_the_same_tensors",
    "assert_exception",
    "capture_call_output",
    "device_count",
    "execute_subprocess_async",
    "get_backend",
    "get_launch_command",
    "get_torch_dist_unique_port",
    "is_aim_available",
    "is_bnb_available",
    "is_clearml_available",
    "is_comet_ml_available",
    "is_cuda_available",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_dvclive_available",
    "is_fp8_available",
    "is_fp16_available",
    "is_habana_gaudi1",
    "is_hpu_available",
    "is_import_timer_available",
    "is_matplotlib_available",
    "is_mlflow_available",
    "is_mlu_available",
    "is_mps_available",
    "is_musa_available",
    "is_neuron_available",
    "is_npu_available",
    "is_pandas_available",
    "is_peft_available",
    "is_pippy_available",
    "is_pytest_available",
    "is_schedulefree_available",
    "is_sdaa_available",
    "is_swanlab_available",
    "is_tensorboard_available",
    "is_timm_available",
    "is_torch_version",
    "is_torch_xla_available",
    "is_torchao_available",
    "is_torchdata_stateful_dataloader_available",
    "is_torchvision_available",
    "is_trackio_available",
    "is_transformer_engine_available",
    "is_transformer_engine_mxfp8_available",
    "is_transformers_available",
    "is_triton_available",
    "is_wandb_available",
    "is_xpu_available",
    "memory_allocated_func",
    "parse_flag_from_env",
    "path_in_accelerate_package",
    "pytest_xdist_worker_id",
    "require_aim",
    "require_bnb",
    "require_clearml",
    "require_comet_ml",
    "require_cpu",
    "require_cuda",
    "require_cuda_or_hpu",
    "require_cuda_or_xpu",
    "require_datasets",
    "require_deepspeed",
    "require_dvclive",
    "require_fp8",
    "require_fp16",
    "require_fsdp2",
    "require_huggingface_suite",
    "require_import_timer",
    "require_matplotlib",
    "require_mlflow",
    "require_mlu",
    "require_mps",
    "require_multi_device",
    "require_multi_gpu",
    "require_multi_gpu_or_xpu",
    "require_multi_xpu",
    "require_musa",
    "require_neuron",
    "require_non_cpu",
    "require_non_hpu",
    "require_non_torch_xla",
    "require_non_xpu",
    "require_npu",
    "require_pandas",
    "require_peft",
    "require_pippy",
    "require_schedulefree",
    "require_sdaa",
    "require_single_device",
    "require_single_gpu",
    "require_single_xpu",
    "require_swanlab",
    "require_tensorboard",
    "require_timm",
    "require_torch_min_version",
    "require_torchao",
    "require_torchdata_stateful_dataloader",
    "require_torchvision",
    "require_tp",
    "require_tpu",
    "require_trackers",
    "require_trackio",
    "require_transformer_engine",
    "require_transformer_engine_mxfp8",
    "require_transformers",
    "require_triton",
    "require_wandb",
    "require_xpu",
    "run_command",
    "run_first",
    "skip",
    "slow",
    "torch_device",
]

T = TypeVar("T", bound=Callable[..., Any])


def _device_type_and_count() -> tuple[str, int]:
    if is_cuda_available():
        return "cuda", torch.cuda.device_count()
    if is_xpu_available():
        return "xpu", torch.xpu.device_count()
    if is_mps_available():
        return "mps", 1
    return "cpu", 1


def get_backend() -> tuple[str, int, Callable[[], int]]:
    """This machine's accelerator type, its device count, and its allocated-memory function."""
    kind, count = _device_type_and_count()
    return kind, count, memory_allocated_func


#: The accelerator type of this machine (``"cuda"``, ``"xpu"``, ``"mps"`` or ``"cpu"``).
torch_device, device_count = _device_type_and_count()


def _skip_unless(condition: bool, reason: str) -> Callable[[T], T]:
    return unittest.skipUnless(condition, reason)


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """The boolean environment variable ``key`` (``default`` when unset).

    Raises:
        ValueError: ``key`` is set to something that is not a yes/no value.
    """
    value = os.environ.get(key)
    if value is None:
        return default
    try:
        return str_to_bool(value, True, name=key)
    except ValueError:
        raise ValueError(
            f"If set, {key} must be yes or no (got {key}={value!r}); use 1/0, true/false or yes/no."
        ) from None


def slow(test_case: T) -> T:
    """Run only when ``RUN_SLOW`` is a true value (slow tests are skipped by default)."""
    return _skip_unless(parse_flag_from_env("RUN_SLOW", default=False), "test is slow")(test_case)


def skip(test_case: T) -> T:
    """Always skip."""
    return unittest.skip("test was skipped")(test_case)


def run_first(test_case: T) -> T:
    """Mark a test to run first (a ``pytest.mark.order(1)`` when pytest-order is installed)."""
    try:
        import pytest

        return cast(T, pytest.mark.order(1)(test_case))
    except (ImportError, AttributeError):
        return test_case


def require_cpu(test_case: T) -> T:
    """Run only when no accelerator is present."""
    return _skip_unless(torch_device == "cpu", "test requires only a CPU")(test_case)


def require_non_cpu(test_case: T) -> T:
    """Run only when an accelerator is present."""
    return _skip_unless(torch_device != "cpu", "test requires an accelerator")(test_case)


def require_cuda(test_case: T) -> T:
    """Run only with a CUDA GPU."""
    return _skip_unless(is_cuda_available(), "test requires a CUDA GPU")(test_case)


def require_xpu(test_case: T) -> T:
    """Run only with an Intel XPU."""
    return _skip_unless(is_xpu_available(), "test requires an XPU")(test_case)


def require_mps(test_case: T) -> T:
    """Run only with Apple's MPS device."""
    return _skip_unless(is_mps_available(), "test requires MPS")(test_case)


def require_tpu(test_case: T) -> T:
    """Run only with torch_xla on a TPU."""
    return _skip_unless(is_torch_xla_available(check_is_tpu=True), "test requires a TPU")(test_case)


def require_non_torch_xla(test_case: T) -> T:
    """Run only without torch_xla."""
    return _skip_unless(not is_torch_xla_available(), "test requires no torch_xla")(test_case)


def require_single_device(test_case: T) -> T:
    """Run only with exactly one accelerator."""
    return _skip_unless(
        torch_device != "cpu" and device_count == 1, "test requires one accelerator"
    )(test_case)


def require_single_gpu(test_case: T) -> T:
    """Run only with exactly one CUDA GPU."""
    return _skip_unless(is_cuda_available() and device_count == 1, "test requires one GPU")(
        test_case
    )


def require_multi_device(test_case: T) -> T:
    """Run only with several accelerators."""
    return _skip_unless(
        torch_device != "cpu" and device_count > 1, "test requires several accelerators"
    )(test_case)


def require_multi_gpu(test_case: T) -> T:
    """Run only with several CUDA GPUs."""
    return _skip_unless(is_cuda_available() and device_count > 1, "test requires several GPUs")(
        test_case
    )


def require_fp16(test_case: T) -> T:
    """Run only where fp16 mixed precision works (always with torch's CPU and GPU builds)."""
    return test_case


def require_torchvision(test_case: T) -> T:
    """Run only with torchvision installed."""
    return _skip_unless(is_torchvision_available(), "test requires torchvision")(test_case)


def require_torch_min_version(test_case: T | None = None, version: str | None = None) -> Any:
    """Run only with torch >= ``version`` (usable with or without arguments)."""
    if test_case is None:
        return lambda case: require_torch_min_version(case, version=version)
    if version is None:
        raise ValueError("require_torch_min_version(version=None): pass a version like '2.1'.")
    return _skip_unless(is_torch_version(">=", version), f"test requires torch>={version}")(
        test_case
    )


def get_launch_command(**kwargs: Any) -> list[str]:
    """``accel launch`` with ``--key=value`` flags (``--key`` for True, nothing for None/False).

    Runs through this interpreter, so it works without the venv's ``bin`` on ``PATH``.
    """
    command = [sys.executable, "-m", "accel_launch.cli", "launch"]
    for key, value in kwargs.items():
        if isinstance(value, bool):
            if value:
                command.append(f"--{key}")
        elif value is not None:
            command.append(f"--{key}={value}")
    return command


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count)


def get_torch_dist_unique_port() -> int:
    """A free TCP port on localhost for a test's rendezvous."""
    return find_free_port()


def pytest_xdist_worker_id() -> int:
    """This pytest-xdist worker's number (``gw3`` -> 3); 0 outside pytest-xdist."""
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", "gw0"))
    return int(match.group(1)) if match else 0


def path_in_accelerate_package(*components: str) -> Path:
    """A path inside the installed ``accel`` package (Accelerate's name for the helper)."""
    import accel

    return Path(accel.__file__).parent.joinpath(*components)


def memory_allocated_func() -> int:
    """Bytes the current accelerator has allocated now (0 on a CPU, which torch does not count)."""
    if torch_device == "cuda":
        return int(torch.cuda.memory_allocated())
    if torch_device == "xpu":
        return int(torch.xpu.memory_allocated())
    if torch_device == "mps":
        return int(torch.mps.current_allocated_memory())
    return 0


class TempDirTestCase(unittest.TestCase):
    """A test case with one temporary folder per class (``self.tmpdir``), emptied before each test."""

    clear_on_setup = True
    tmpdir: Path

    @classmethod
    def setUpClass(cls) -> None:
        """Create the folder."""
        cls.tmpdir = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls) -> None:
        """Remove the folder."""
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def setUp(self) -> None:
        """Empty the folder (when ``clear_on_setup``)."""
        if self.clear_on_setup:
            for path in self.tmpdir.iterdir():
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()


class MockingTestCase(unittest.TestCase):
    """A test case whose ``setUp`` starts patches (built only then) that stop after each test.

    Call :meth:`add_mocks` at the end of ``setUp``, after ``super().setUp()``.
    """

    mocks: list[Any]

    def add_mocks(self, mocks: Any) -> None:
        """Start ``mocks`` (one ``mock.patch`` object or a list of them) until this test ends."""
        self.mocks = list(mocks) if isinstance(mocks, (tuple, list)) else [mocks]
        for patcher in self.mocks:
            patcher.start()
            self.addCleanup(patcher.stop)


class AccelerateTestCase(unittest.TestCase):
    """A test case that resets the process-wide state after every test."""

    def tearDown(self) -> None:
        """Reset the ``AcceleratorState``, its ``PartialState`` and the ``GradientState``."""
        from accel.accelerator_state import AcceleratorState
        from accel_state import GradientState

        super().tearDown()
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


@dataclasses.dataclass
class SubprocessRunOutput:
    """Exit code and output lines of :func:`execute_subprocess_async`."""

    returncode: int
    stdout: list[str]
    stderr: list[str]


def execute_subprocess_async(
    cmd: Sequence[str],
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 180,
    quiet: bool = False,
    echo: bool = True,
) -> SubprocessRunOutput:
    """Run ``cmd``, fail loudly on a non-zero exit or a timeout.

    Raises:
        RuntimeError: The command failed (its stderr is in the message) or timed out.
    """
    if echo:
        print("\ncmd:", " ".join(map(str, cmd)))
    try:
        done = subprocess.run(
            list(cmd),
            env=dict(env) if env is not None else None,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"{' '.join(map(str, cmd))!r} timed out after {timeout} s") from error
    if not quiet:
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, cmd))!r} failed with exit code {done.returncode}; "
            f"stderr:\n{done.stderr}"
        )
    return SubprocessRunOutput(done.returncode, done.stdout.splitlines(), done.stderr.splitlines())


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """Collective: whether every process holds a tensor equal to this one."""
    gathered = accel_ops.gather(tensor[None].clone())
    return all(torch.equal(gathered[index], tensor) for index in range(gathered.shape[0]))


@contextlib.contextmanager
def assert_exception(
    exception_class: type[BaseException], msg: str | None = None
) -> Iterator[None]:
    """Assert that the block raises ``exception_class`` (whose text contains ``msg``)."""
    try:
        yield
    except exception_class as error:
        if msg is not None and msg not in str(error):
            raise AssertionError(
                f"{exception_class.__name__} raised without {msg!r}: {error}"
            ) from error
        return
    raise AssertionError(f"Expected {exception_class.__name__} to be raised")


def capture_call_output(func: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """What ``func(*args, **kwargs)`` prints to stdout."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        func(*args, **kwargs)
    return buffer.getvalue()


class SubprocessCallException(Exception):
    """A command run by :func:`run_command` failed; the message holds its output."""


def run_command(
    command: Sequence[str | os.PathLike[str]],
    return_stdout: bool = False,
    env: Mapping[str, str] | None = None,
) -> str | None:
    """Run ``command`` (stderr merged into stdout); return its output when ``return_stdout``.

    Raises:
        SubprocessCallException: The command exited non-zero (its output is in the message).
    """
    argv = [str(part) for part in command]
    try:
        output = subprocess.check_output(
            argv, stderr=subprocess.STDOUT, env=dict(env) if env is not None else None
        )
    except subprocess.CalledProcessError as error:
        raise SubprocessCallException(
            f"Command `{' '.join(argv)}` failed with the following error:\n\n"
            f"{error.output.decode(errors='replace')}"
        ) from error
    return output.decode("utf-8", errors="replace") if return_stdout else None
