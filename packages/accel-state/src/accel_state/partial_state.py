"""``PartialState``: who am I, where am I, which device and backend.

Every instance shares one process-wide record (the process group is process-wide too); the first
instance fills it. :func:`accel_state.reset_state` clears it.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

import torch
import torch.distributed as dist

from accel_state.cluster import ProcessLayout, resolve_cluster_environment
from accel_state.cluster.slurm import check_task_count as check_slurm_task_count
from accel_state.contract import LaunchContract
from accel_state.device import select_backend, select_device, use_named_device
from accel_state.device_mesh import activate, active_parallel_mesh
from accel_state.errors import (
    EnvironmentConfigError,
    PartialStateResetError,
    StateConflictError,
)
from accel_state.process_group import (
    lower_timeouts,
    resolve_timeout,
    start_process_group,
    start_single_process_group,
    stop_process_group,
)
from accel_state.shared import shared_dict
from accel_state.splitting import split_inputs
from accel_state.types import DistributedType

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class PartialState:
    """Process-wide facts about the running job, without any training-specific settings.

    Args:
        cpu: Force the CPU even when an accelerator is present (also ``ACCEL_USE_CPU``).
        backend: Communication backend; default nccl on CUDA, xla on XLA, gloo on CPU
            (also ``ACCEL_BACKEND``).
        timeout: Seconds (or a ``timedelta``) a collective may wait before the process raises;
            default ``ACCEL_PROCESS_GROUP_TIMEOUT``, else 600 s until :meth:`lower_timeouts`
            (the Accelerator calls it after the first training step) and 300 s from then on.
        environ: Environment to read instead of ``os.environ`` (for tests and tools).
        _use_sagemaker_dp: Accelerate's switch for SageMaker's data-parallel library (which
            transformers passes there); ``True`` is refused, accel does not target SageMaker.

    Raises:
        StateConflictError: The state already exists with a different device or backend request.
        accel_state.EnvironmentConfigError: Malformed launcher variables, or
            ``_use_sagemaker_dp=True``.
        accel_state.ProcessGroupError: The process group could not be started.

    """

    _shared_state: ClassVar[dict[str, Any]] = shared_dict("PartialState")

    def __init__(
        self,
        cpu: bool = False,
        *,
        backend: str | None = None,
        timeout: datetime.timedelta | float | None = None,
        environ: Mapping[str, str] | None = None,
        _use_sagemaker_dp: bool | None = None,
    ) -> None:
        if _use_sagemaker_dp:
            # transformers asks for it only inside SageMaker's data-parallel jobs.
            raise EnvironmentConfigError(
                "PartialState(_use_sagemaker_dp=True): SageMaker's data-parallel library is not "
                "supported by accel; start the job with accel launch or torchrun instead."
            )
        self.__dict__ = self._shared_state
        if self.initialized:
            self._check_compatible(cpu, backend)
            return
        env = os.environ if environ is None else environ
        contract = LaunchContract.from_env(env)
        use_cpu = cpu or contract.use_cpu
        environment = resolve_cluster_environment(env)
        layout = environment.layout(env)
        use_xla = bool(env.get("PJRT_DEVICE")) and not use_cpu
        if contract.torch_device is not None and not use_cpu:
            device = use_named_device(contract.torch_device)
        else:
            device = select_device(layout, use_cpu=use_cpu, use_xla=use_xla)
        chosen_backend = select_backend(device, backend or contract.backend)
        owns_group = False
        timeouts = resolve_timeout(timeout, contract.process_group_timeout)
        if dist.is_available() and dist.is_initialized():
            layout = _layout_from_existing_group(layout)
        check_slurm_task_count(env, layout)
        if _needs_process_group(layout, contract):
            owns_group = start_process_group(layout, chosen_backend, timeouts.startup, device)
        self._shared_state.update(
            layout=layout,
            cluster_environment=environment.name,
            contract=contract,
            device=device,
            backend=chosen_backend if layout.world_size > 1 or owns_group else None,
            requested_cpu=use_cpu,
            requested_backend=backend,
            owns_process_group=owns_group,
            debug=contract.debug,
            timeouts=timeouts,
            timeout=timeouts.startup,
        )

    # ------------------------------------------------------------------ inspection
    @property
    def initialized(self) -> bool:
        """Whether the process-wide state has been filled."""
        return "layout" in self._shared_state

    @classmethod
    def _reset_state(cls) -> None:
        """Forget the shared state without touching the process group (tests only)."""
        cls._shared_state.clear()

    def _require(self, key: str) -> Any:
        """The shared setting ``key``, or an error explaining that the state was reset.

        Raises:
            PartialStateResetError: ``PartialState._reset_state()`` (or
                ``accel_state.reset_state()``) cleared the settings after this object was made.
        """
        try:
            return self._shared_state[key]
        except KeyError:
            raise PartialStateResetError(
                f"`PartialState` object has no attribute `{key}`. This happens if "
                "`PartialState._reset_state()` (or accel_state.reset_state()) was called and an "
                "`Accelerator` or `PartialState` was not reinitialized: create a new "
                "PartialState() after the reset and use that one."
            ) from None

    def _check_compatible(self, cpu: bool, backend: str | None) -> None:
        if cpu and self.device.type != "cpu":
            raise StateConflictError(
                f"PartialState already runs on {self.device}; cpu=True cannot be honoured now. "
                "Pass cpu=True to the first PartialState/Accelerator, or call accel_state.reset_state()."
            )
        if backend is not None and self.backend is not None and backend != self.backend:
            raise StateConflictError(
                f"The process group already uses backend {self.backend!r}; backend={backend!r} "
                "cannot be honoured now. Call accel_state.reset_state() first."
            )

    def ensure_process_group(self, reason: str) -> bool:
        """Start a one-process group if this single process has none (FSDP needs one).

        A job launched with ``accel launch --use_fsdp --num_processes 1`` has one already; a
        plain ``python script.py`` that asks for FSDP in code gets one here, on an in-memory
        store, owned by this state (``reset_state()`` stops it).

        Args:
            reason: What needs the group, for the error message.

        Returns:
            True when this call started the group.

        Raises:
            EnvironmentConfigError: Several processes without a group (a launcher problem).
        """
        if dist.is_available() and dist.is_initialized():
            return False
        if self.num_processes != 1:
            raise EnvironmentConfigError(
                f"{reason} needs a process group, but this process (rank {self.process_index} of "
                f"{self.num_processes}) has none: start the job with `accel launch` or torchrun."
            )
        requested = self._require("requested_backend") or self.contract.backend
        backend = select_backend(self.device, requested)
        start_single_process_group(backend, self._require("timeouts").startup, self.device)
        self._shared_state.update(backend=backend, owns_process_group=True)
        return True

    @property
    def layout(self) -> ProcessLayout:
        """Ranks, sizes and rendezvous address of this process."""
        return self._require("layout")  # type: ignore[no-any-return]

    @property
    def contract(self) -> LaunchContract:
        """The launcher settings this process was started with."""
        return self._require("contract")  # type: ignore[no-any-return]

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self._require("device")  # type: ignore[no-any-return]

    @property
    def default_device(self) -> torch.device:
        """The best device this machine offers (an accelerator if one is visible, else the CPU).

        Unlike :attr:`device` it ignores ``cpu=True`` and the process's local rank.
        """
        for name in ("mps", "cuda", "npu", "xpu", "mlu", "sdaa", "musa", "hpu"):
            module = getattr(torch, name, None)
            is_available = getattr(module, "is_available", None)
            if callable(is_available) and is_available():
                return torch.device(name)
        return torch.device("cpu")

    @property
    def fork_launched(self) -> bool:
        """Whether this process is a worker forked by ``notebook_launcher`` (``FORK_LAUNCHED``)."""
        return os.environ.get("FORK_LAUNCHED", "0").strip().lower() in ("1", "true", "yes", "on")

    def set_device(self) -> None:
        """Make :attr:`device` the current device of its torch backend (nothing on the CPU)."""
        device = self.device
        if device.type in ("cpu", "meta"):
            return
        module = getattr(torch, device.type, None)
        set_current = getattr(module, "set_device", None)
        if not callable(set_current):
            raise StateConflictError(
                f"PartialState.set_device(): torch.{device.type} has no set_device, so device "
                f"{device} cannot be made current; select it with torch.device instead."
            )
        set_current(device if device.index is not None else torch.device(device.type, 0))

    @property
    def backend(self) -> str | None:
        """The communication backend, or ``None`` for a single process."""
        return self._require("backend")  # type: ignore[no-any-return]

    @property
    def timeout(self) -> datetime.timedelta:
        """How long a collective may wait now before this process raises."""
        return self._require("timeout")  # type: ignore[no-any-return]

    @property
    def collective_timeout(self) -> datetime.timedelta:
        """The timeout once the first training step is done (see :meth:`lower_timeouts`)."""
        return self._require("timeouts").collective  # type: ignore[no-any-return]

    def lower_timeouts(self) -> bool:
        """After the first training step: set :attr:`collective_timeout` on every process group.

        A no-op when the timeout was given explicitly (it applies from the start), on one
        process, or when already done. It waits for every process first, so that no process
        lowers its timeout while a peer still works on its first step. Call it on every process.

        Returns:
            Whether the timeouts were lowered by this call.
        """
        timeouts = self._require("timeouts")
        if (
            timeouts.explicit
            or self.timeout == timeouts.collective
            or not self.use_distributed
            or self.device.type == "xla"
        ):
            return False
        self.wait_for_everyone()
        lower_timeouts(timeouts.collective)
        self._shared_state["timeout"] = timeouts.collective
        return True

    @property
    def restart_count(self) -> int:
        """Restarts before this process started: torch elastic's plus SLURM's requeues."""
        return self.contract.restart_count

    @property
    def debug(self) -> bool:
        """Whether debug mode (cross-rank checks before collectives) is on."""
        return bool(self._require("debug"))

    @debug.setter
    def debug(self, value: bool) -> None:
        """Turn debug mode on or off for this process (collectives read it on each call)."""
        self._shared_state["debug"] = bool(value)

    @property
    def num_processes(self) -> int:
        """Number of processes in the whole job."""
        return self.layout.world_size

    @property
    def process_index(self) -> int:
        """Global rank of this process."""
        return self.layout.rank

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its machine."""
        return self.layout.local_rank

    @property
    def num_nodes(self) -> int:
        """Number of machines in the job."""
        return self.layout.num_nodes

    @property
    def node_rank(self) -> int:
        """Index of this machine."""
        return self.layout.node_rank

    @property
    def is_main_process(self) -> bool:
        """True on global rank 0."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on local rank 0 of each machine."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """True on the highest global rank."""
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self.num_processes > 1

    @property
    def data_parallel_size(self) -> int:
        """Distinct batches per step: every process, or the data-parallel ranks of the job's mesh.

        With a :class:`~accel_state.ParallelismConfig` mesh active, ranks that differ only in
        their tensor/context-parallel coordinate share a batch; dataloaders shard over these.
        """
        mesh = active_parallel_mesh()
        return self.num_processes if mesh is None else mesh.data_parallel_size

    @property
    def data_parallel_process_index(self) -> int:
        """Which of the :attr:`data_parallel_size` batches this process gets."""
        mesh = active_parallel_mesh()
        return self.process_index if mesh is None else mesh.data_parallel_rank

    @property
    def data_parallel_group(self) -> Any:
        """The process group of the data-parallel ranks this process belongs to.

        ``None`` when that is every process (no mesh, or a mesh of data-parallel dimensions
        only). Only meaningful when :attr:`data_parallel_size` is above 1.
        """
        mesh = active_parallel_mesh()
        return None if mesh is None else mesh.data_parallel_group()

    @property
    def distributed_type(self) -> DistributedType:
        """The job's distributed mode, derived from the launcher settings and the device."""
        if self.contract.use_deepspeed:
            return DistributedType.DEEPSPEED
        if self.contract.use_fsdp and self.device.type != "xla":
            return DistributedType.FSDP
        if self.device.type == "xla":
            return DistributedType.XLA
        if not self.use_distributed:
            return DistributedType.NO
        if self.device.type == "cuda":
            return DistributedType.MULTI_GPU
        if self.device.type == "xpu":
            return DistributedType.MULTI_XPU
        return DistributedType.MULTI_CPU

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}\n"
            f"Number of processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
            f"Backend: {self.backend}\n"
            f"Launched by: {self._require('cluster_environment')}\n"
        )

    # ------------------------------------------------------------------ synchronisation
    def wait_for_everyone(self) -> None:
        """Block until every process reaches this call (does nothing in a single process)."""
        if not self.use_distributed:
            return
        if self.device.type == "xla":
            import torch_xla.core.xla_model as xm

            xm.rendezvous("accel_state.wait_for_everyone")
            return
        dist.barrier()

    @contextlib.contextmanager
    def _first(self, go_first: bool) -> Iterator[None]:
        if not go_first:
            self.wait_for_everyone()
        yield
        if go_first:
            self.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context manager: the main process runs the block before all others do."""
        return self._first(self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context manager: each machine's local main process runs the block before the others."""
        return self._first(self.is_local_main_process)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: T, apply_padding: bool = False) -> Iterator[T]:
        """Yield this process's contiguous share of ``inputs``.

        Args:
            inputs: A list, tuple, tensor, or dict of those (split on the first dimension).
            apply_padding: Repeat the last element so every process gets the same count (useful
                before :func:`gather`; drop the extras afterwards).

        """
        yield split_inputs(inputs, self.num_processes, self.process_index, apply_padding)

    # ------------------------------------------------------------------ running on some processes
    def _only_if(self, condition: Callable[[], bool], function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if condition():
                return function(*args, **kwargs)
            return None

        return wrapper  # type: ignore[return-value]

    def on_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on the main process only (others get ``None``)."""
        return self._only_if(lambda: self.is_main_process, function)

    def on_local_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on each machine's local main process only."""
        return self._only_if(lambda: self.is_local_main_process, function)

    def on_last_process(self, function: F) -> F:
        """Decorator: run ``function`` on the last process only."""
        return self._only_if(lambda: self.is_last_process, function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on global rank ``process_index`` only.

        Use as ``@state.on_process(process_index=1)``.
        """
        if process_index is None:
            raise ValueError(
                "on_process needs process_index=<rank>, e.g. @state.on_process(process_index=1)."
            )
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._only_if(lambda: self.process_index == process_index, function)

    def on_local_process(
        self, function: F | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorator: run ``function`` on local rank ``local_process_index`` of each machine only."""
        if local_process_index is None:
            raise ValueError(
                "on_local_process needs local_process_index=<rank>, "
                "e.g. @state.on_local_process(local_process_index=1)."
            )
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._only_if(lambda: self.local_process_index == local_process_index, function)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on each machine's local main process only."""
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    def destroy_process_group(self) -> None:
        """Tear down the process group and forget the state; a later PartialState starts afresh."""
        stop_process_group()
        activate(None)
        self._shared_state.clear()


def _layout_from_existing_group(layout: ProcessLayout) -> ProcessLayout:
    """When the caller already started a process group, its rank and size are the truth."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if (rank, world_size) == (layout.rank, layout.world_size):
        return layout
    local_world_size = layout.local_world_size if layout.world_size == world_size else world_size
    return ProcessLayout(
        rank=rank,
        local_rank=rank % local_world_size,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=rank // local_world_size,
        num_nodes=world_size // local_world_size,
        master_addr=layout.master_addr,
        master_port=layout.master_port,
        source="existing process group",
    )


def _needs_process_group(layout: ProcessLayout, contract: LaunchContract) -> bool:
    """Whether this process starts (or adopts) the default process group.

    Every multi-process job does. So does a one-process job that a launcher started with a
    rendezvous address (torchrun / ``accel launch``) for a sharding engine, because FSDP and
    DeepSpeed need a group even of one (``accel launch --use_fsdp --num_processes 1``), as under
    Accelerate. A plain ``python script.py`` never starts one.
    """
    if layout.world_size > 1 or (dist.is_available() and dist.is_initialized()):
        return True
    launched = layout.source == "torchelastic"
    return launched and (contract.use_fsdp or contract.use_deepspeed)
