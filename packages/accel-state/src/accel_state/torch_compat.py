"""Every torch-version-dependent import and behaviour below accel, and the feature gates.

accel-state, accel-ops, accel-data, accel-ckpt and accel-launch support torch 2.4 and newer. What
moved or arrived between releases is looked up here, nowhere else, so that a feature's code reads
the same on every torch, and an old torch fails at ``prepare()`` or at launch with a sentence, not
at import time with an ``AttributeError``.

A feature that an old torch cannot do has a :class:`FeatureGate`: the feature, the oldest torch
that has it, what older releases lack, and what works instead. :meth:`FeatureGate.require` turns
a gate into the error; the docs' version table (``scripts/torch_feature_table.py``) is generated
from the same gates (this module's :data:`GATES` and ``accel.torch_compat``'s).

Example:
    >>> from accel_state.torch_compat import GATES, torch_at_least
    >>> torch_at_least("2.4")
    True
    >>> GATES["device_mesh"].require()  # raises TorchFeatureError on torch 2.4  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from accel_state.errors import TorchFeatureError

OLDEST_SUPPORTED_TORCH = "2.4"


def release_of(version: str) -> tuple[int, ...]:
    """The release numbers of a torch version string: ``"2.4.1+cu121"`` gives ``(2, 4, 1)``.

    Pre-release and local parts are dropped, so a nightly ``2.6.0a0+git...`` counts as 2.6.0.

    Raises:
        ValueError: ``version`` does not start with a release number.
    """
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if match is None:
        raise ValueError(f"version={version!r} is not a torch version (expected such as '2.6.0')")
    return tuple(int(part) for part in match.group(1).split("."))


def torch_version() -> str:
    """The running torch's version without its local part (``"2.4.1"`` for ``2.4.1+cu121``)."""
    return str(torch.__version__).split("+", 1)[0]


def torch_at_least(minimum: str, found: str | None = None) -> bool:
    """Whether torch ``found`` (default: the running one) is release ``minimum`` or newer."""
    have = release_of(found if found is not None else torch_version())
    need = release_of(minimum)
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) >= need + (0,) * (width - len(need))


@dataclasses.dataclass(frozen=True)
class FeatureGate:
    """A feature that needs a torch release newer than the oldest accel supports.

    Attributes:
        key: The gate's name in :data:`GATES` (``"fsdp2"``).
        feature: What a user asked for, as the docs name it ("FSDP2 (fully_shard)").
        minimum: The oldest torch release that has it (``"2.6"``).
        reason: What older torch lacks, one clause.
        alternative: What to do instead: a feature that works on older torch, or the upgrade.
        also_needs: Another package whose own torch floor sets ``minimum`` (``"torchft 0.2.0"``).
        limit: A limit that holds on every torch (such as "not on CPU/gloo"), for the docs table.
        cpu_minimum: The oldest torch with which it runs on the CPU over gloo, when later than
            ``minimum`` (older releases lack a gloo collective or a CPU kernel it uses).
        cpu_reason: What those older releases lack on the CPU.
    """

    key: str
    feature: str
    minimum: str
    reason: str
    alternative: str
    also_needs: str | None = None
    limit: str | None = None
    cpu_minimum: str | None = None
    cpu_reason: str = ""

    def needed(self, device_type: str | None = None) -> str:
        """The oldest torch release with the feature on ``device_type`` (``"cpu"``, ``"cuda"``...)."""
        return self.cpu_minimum if device_type == "cpu" and self.cpu_minimum else self.minimum

    def available(self, found: str | None = None, device_type: str | None = None) -> bool:
        """Whether torch ``found`` (default: the running one) has the feature on ``device_type``."""
        return torch_at_least(self.needed(device_type), found)

    def message(self, found: str | None = None, device_type: str | None = None) -> str:
        """The sentence a user reads when the running torch (or ``found``) lacks the feature."""
        version = found if found is not None else torch_version()
        needed = self.needed(device_type)
        on_cpu = needed != self.minimum
        needs = f"torch {needed} or newer" + (" on the CPU (gloo)" if on_cpu else "")
        if self.also_needs:
            needs += f" ({self.also_needs} needs it)"
        reason = self.cpu_reason if on_cpu else self.reason
        return (
            f"{self.feature} needs {needs}; this is torch {version}: {reason}. {self.alternative}"
        )

    def require(
        self,
        found: str | None = None,
        error: type[TorchFeatureError] = TorchFeatureError,
        device_type: str | None = None,
    ) -> None:
        """Raise ``error`` with :meth:`message` unless torch ``found`` has the feature.

        Args:
            found: The torch version to check (default: the running one).
            error: The error class to raise: a package above accel-state passes its own
                subclass of :class:`~accel_state.errors.TorchFeatureError`.
            device_type: The job's device type; ``"cpu"`` applies :attr:`cpu_minimum`.

        Raises:
            TorchFeatureError: The feature needs a newer torch.
        """
        if not self.available(found, device_type):
            version = found if found is not None else torch_version()
            raise error(
                self.message(found, device_type),
                feature=self.feature,
                found=version,
                minimum=self.needed(device_type),
                alternative=self.alternative,
            )


def gate_table(gates: Iterable[FeatureGate]) -> dict[str, FeatureGate]:
    """``gates`` by key.

    Raises:
        ValueError: Two gates share a key.
    """
    table: dict[str, FeatureGate] = {}
    for gate in gates:
        if gate.key in table:
            raise ValueError(f"two feature gates are named {gate.key!r}; give each its own key")
        table[gate.key] = gate
    return table


GATES: Mapping[str, FeatureGate] = gate_table(
    [
        FeatureGate(
            key="fsdp2",
            feature="FSDP2 (fsdp_version=2, fully_shard)",
            minimum="2.6",
            reason="fully_shard and its policies are public in torch.distributed.fsdp from 2.6",
            alternative="FSDP1 (fsdp_version=1) works on this torch; or upgrade torch.",
            cpu_minimum="2.9",
            cpu_reason=(
                "on the CPU, FSDP2's streams lack record_event in torch 2.6, its results differ "
                "from DDP's in 2.7, and 2.8 is untested"
            ),
        ),
        FeatureGate(
            key="device_mesh",
            feature="Device meshes (ParallelismConfig, N-D parallelism)",
            minimum="2.6",
            reason=(
                "accel's mesh strategy builds on DeviceMesh._flatten (2.5), the public DTensor "
                "(2.5), fully_shard and torch.nn.utils.get_total_norm (2.6)"
            ),
            alternative=(
                "Plain data parallelism needs no mesh: drop parallelism_config and use DDP or "
                "FSDP1 (fsdp_version=1); or upgrade torch."
            ),
            cpu_minimum="2.9",
            cpu_reason=(
                "on the CPU, the meshes' FSDP2 and tensor parallelism need torch 2.9 (FSDP2's "
                "CPU streams and gloo's ReduceOp.AVG are missing or wrong before; 2.8 is untested)"
            ),
        ),
        FeatureGate(
            key="tensor_parallel",
            feature="Tensor parallelism (tp_size > 1, tp_plan)",
            minimum="2.6",
            reason="it runs on accel's device meshes, which need torch 2.6",
            alternative="Shard the model with FSDP1 (fsdp_version=1) instead; or upgrade torch.",
            cpu_minimum="2.9",
            cpu_reason=(
                "gloo cannot reduce with ReduceOp.AVG, which tensor parallelism uses, in torch "
                "2.7 and older (2.8 is untested)"
            ),
        ),
        FeatureGate(
            key="context_parallel",
            feature="Context parallelism (cp_size > 1)",
            minimum="2.6",
            reason="torch.distributed.tensor.experimental.context_parallel arrived in torch 2.6",
            alternative="Set cp_size=1; or upgrade torch.",
            limit="CUDA only: torch's ring attention has no CPU kernel (refused on CPU/gloo)",
        ),
        FeatureGate(
            key="fp8_torchao",
            feature="fp8 training through torchao (mixed_precision='fp8', AO backend)",
            minimum="2.11",
            also_needs="accel[fp8]'s torchao 0.18",
            reason="torchao 0.18 supports no older torch",
            alternative="Train with mixed_precision='bf16'; or upgrade torch.",
        ),
        FeatureGate(
            key="flight_recorder_gloo",
            feature="Flight Recorder positions of gloo (CPU) collectives in failure summaries",
            minimum="2.8",
            reason="gloo records its collectives into torch's Flight Recorder from torch 2.8",
            alternative=(
                "accel-ops still reports each rank's last collective in the summary, and NCCL "
                "jobs get Flight Recorder dumps on older torch."
            ),
        ),
        FeatureGate(
            key="failure_summary_every_rank",
            feature="Every failed rank (exit and position) in accel launch's failure summary",
            minimum="2.9",
            reason=(
                "torch elastic before 2.9 reports only the first worker that failed on a "
                "machine, not the ones stopped after it"
            ),
            alternative=(
                "The first failure's traceback and position are reported on any torch; the "
                "other ranks' output above the summary says where each one stopped."
            ),
        ),
        FeatureGate(
            key="replica_groups",
            feature="Replica groups (accel launch --ft_replicas, fault tolerance through torchft)",
            minimum="2.7",
            also_needs="torchft 0.2.0",
            reason="torchft's process groups use torch 2.7's collectives API",
            alternative=(
                "Elastic restarts (accel launch --max_restarts N) recover from a failure by "
                "restarting the job from its last checkpoint on any torch; or upgrade torch."
            ),
        ),
    ]
)


# ---------------------------------------------------------------- version-dependent behaviour
@contextlib.contextmanager
def zip_record_checksums_off() -> Iterator[None]:
    """Switch off ``torch.save``'s per-record CRC-32 while inside (torch 2.6+; a no-op before).

    Torch 2.4 and 2.5 always write them; ``torch.load`` reads the files the same either way.
    """
    serialization: Any = torch.serialization
    if not hasattr(serialization, "set_crc32_options"):
        yield
        return
    before = serialization.get_crc32_options()
    serialization.set_crc32_options(False)
    try:
        yield
    finally:
        serialization.set_crc32_options(before)


@contextlib.contextmanager
def safe_globals(allowed: list[Any]) -> Iterator[None]:
    """Add ``allowed`` to ``torch.load``'s ``weights_only`` allow-list while inside.

    Torch 2.5+ has ``torch.serialization.safe_globals``; torch 2.4 has only the process-wide
    ``add_safe_globals``, so the list is restored on the way out.
    """
    serialization: Any = torch.serialization
    if hasattr(serialization, "safe_globals"):
        with serialization.safe_globals(allowed):
            yield
        return
    before = list(serialization.get_safe_globals())
    serialization.add_safe_globals(allowed)
    try:
        yield
    finally:
        serialization.clear_safe_globals()
        serialization.add_safe_globals(before)


_DTENSOR_MODULES = ("torch.distributed.tensor", "torch.distributed._tensor")


@functools.cache
def dtensor_class() -> type | None:
    """Torch's ``DTensor`` class: public in ``torch.distributed.tensor`` from 2.5, private before.

    ``None`` where torch was built without distributed support. Importing it loads DTensor, so
    callers ask only once they hold a tensor that may be one. Looked up once (per-step paths ask
    for every parameter).
    """
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor  # type: ignore[attr-defined,no-redef]
        except ImportError:
            return None
    return DTensor


def is_dtensor(value: object) -> bool:
    """Whether ``value`` is a DTensor, without importing DTensor for plain tensors and objects.

    A DTensor is only ever made after ``torch.distributed.tensor`` (or ``_tensor``) was
    imported, so a process that never imported it holds none.
    """
    if not isinstance(value, torch.Tensor):
        return False
    if not any(name in sys.modules for name in _DTENSOR_MODULES):
        return False
    cls = dtensor_class()
    return cls is not None and isinstance(value, cls)


def local_dcp_options() -> dict[str, Any]:
    """Keyword arguments that make DCP's ``save``/``load`` run in this process alone.

    ``no_dist=True`` from torch 2.5; torch 2.4 has no such argument and runs alone (with a
    warning) whenever no process group is initialised.
    """
    import inspect

    from torch.distributed.checkpoint.state_dict_saver import save

    return {"no_dist": True} if "no_dist" in inspect.signature(save).parameters else {}


@functools.cache
def dcp_plan_caching() -> bool:
    """Whether DCP's ``DefaultSavePlanner`` can cache save plans (``enable_plan_caching``).

    Newer torch (2.13 has it; 2.4 does not) lets a repeated save with unchanged local plans
    send empty, unusable plans and reuse the coordinator's cached global plan and metadata.
    """
    import inspect

    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    init_takes_it = (
        "enable_plan_caching" in inspect.signature(DefaultSavePlanner.__init__).parameters
    )
    return init_takes_it and hasattr(DefaultSavePlanner, "_create_global_plan")


@functools.cache
def dcp_checks_cover_of_single_plan() -> bool:
    """Whether DCP refuses a one-process save plan whose chunks do not cover a tensor whole.

    torch 2.4 checks that the chunks of every tensor fill it for any number of plans; newer
    releases only when several processes planned. Found by asking torch's own validator.
    """
    from torch.distributed.checkpoint import default_planner
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.planner import SavePlan

    half = ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([1]))
    entry = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([2]), [half])
    logger = default_planner.logger
    quiet, logger.disabled = logger.disabled, True  # the probe's refusal is no news to a user
    try:
        outcome: Any = default_planner._validate_global_plan([SavePlan([])], Metadata({"t": entry}))
    finally:
        logger.disabled = quiet
    # torch 2.4 answers a bool (False: refused); newer ones a list of errors (empty: accepted).
    return outcome is False or (bool(outcome) and not isinstance(outcome, bool))


#: The oldest torch whose Python process-group object lets go of the GIL before the C++ group
#: joins its gloo worker threads. Older ones hold it, so freeing a group whose worker still has
#: a Python object to free (the thread state a collective started in backward carries) waits
#: forever: seen in accel's group-ending tests at exit and between jobs on torch 2.4 and 2.6
#: (2.7 and 2.8 untested, so kept on the safe side; 2.13 frees them safely).
GROUP_FREE_RELEASES_GIL_FROM = "2.9"


def group_free_releases_gil() -> bool:
    """Whether dropping a process group's last reference is safe on this torch (see above)."""
    return torch_at_least(GROUP_FREE_RELEASES_GIL_FROM)


def keep_forever(obj: object) -> None:
    """Give ``obj`` a reference nothing drops, not even the interpreter's shutdown.

    For process groups on a torch older than :data:`GROUP_FREE_RELEASES_GIL_FROM`: their worker
    threads end with the process instead of in a destructor that could deadlock.
    """
    import ctypes

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def accelerator_module() -> Any:
    """``torch.accelerator`` (torch 2.6+), or ``None`` on older torch."""
    return getattr(torch, "accelerator", None)


__all__ = [
    "GATES",
    "GROUP_FREE_RELEASES_GIL_FROM",
    "OLDEST_SUPPORTED_TORCH",
    "FeatureGate",
    "accelerator_module",
    "dcp_checks_cover_of_single_plan",
    "dcp_plan_caching",
    "dtensor_class",
    "gate_table",
    "group_free_releases_gil",
    "keep_forever",
    "is_dtensor",
    "local_dcp_options",
    "release_of",
    "safe_globals",
    "torch_at_least",
    "torch_version",
    "zip_record_checksums_off",
]
