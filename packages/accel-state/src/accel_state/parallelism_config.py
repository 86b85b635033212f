"""``ParallelismConfig``: the degrees of N-D parallelism, checked, and the mesh they describe.

Accelerate's fields and meanings, in the style of torchtitan's ``ParallelDims``: the processes of
a job form a grid ``dp_replicate x dp_shard x cp x sp x tp`` (in that order, the mesh's
dimension order). Ranks that differ only in ``tp``/``cp``/``sp`` work on the same batch; the data
is split over ``dp_replicate x dp_shard`` (the flattened ``dp`` mesh), parameters are sharded over
``dp_shard x cp x sp`` (``dp_shard_cp``) and replicated over ``dp_replicate`` (HSDP), and the
loss is averaged over ``dp_cp``.

A field left ``None`` takes its ``PARALLELISM_CONFIG_*`` variable (what ``accel launch
--parallelism_config_*`` sets; :mod:`accel_state.contract`), else its default. One degree may be
``-1``: it takes the processes the others leave (torchtitan's rule; Accelerate has none).

This module imports no torch (the launcher checks degrees with it); the meshes themselves are
built by :class:`accel_state.device_mesh.ParallelMesh`.

Example:
    >>> from accel_state import ParallelismConfig
    >>> config = ParallelismConfig(dp_shard_size=2, tp_size=-1).resolve(world_size=8)
    >>> config.tp_size, config.active_mesh_dims
    (4, ['dp_shard', 'tp'])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from accel_state.contract import parallelism_variable, read_parallelism_settings
from accel_state.envvars import str_to_bool
from accel_state.errors import EnvironmentConfigError, ParallelismConfigError

if TYPE_CHECKING:
    from accel_state.device_mesh import ParallelMesh

#: Mesh dimensions in the order the mesh lays them out (the last varies fastest).
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
#: Degree that takes the leftover processes.
AUTO = -1
CP_BACKENDS = ("torch",)
SP_BACKENDS = ("deepspeed", "accelerate")
CP_COMM_STRATEGIES = ("allgather", "alltoall")


def _from_variable(key: str, raw: str, kind: type) -> Any:
    """A ``PARALLELISM_CONFIG_*`` value as ``kind``, or an error naming the variable."""
    name = parallelism_variable(key)
    if kind is bool:
        return str_to_bool(raw, True, name=name)
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise EnvironmentConfigError(f"{name}={raw!r} is not an integer.") from None
    return raw


def _setting(value: Any, key: str, kind: type, default: Any) -> Any:
    """``value`` when given, else the launcher's ``PARALLELISM_CONFIG_<KEY>``, else ``default``."""
    if value is not None:
        return value
    raw = read_parallelism_settings().get(key)
    return default if raw is None else _from_variable(key, raw, kind)


def _choice(field: str, value: Any, choices: Sequence[str]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise ParallelismConfigError(
            f"{field}={value!r} is not supported; choose one of {', '.join(choices)}."
        )
    return text


@dataclasses.dataclass
class TorchTensorParallelConfig:
    """Tensor-parallel settings: ``ParallelismConfig(tp_size=N, tp_handler=...)``.

    Args:
        enable_async_tp: Overlap the TP collectives with the matmuls (torch's async TP: CUDA,
            symmetric memory, under ``torch.compile``).
        plan: accel: how to split a plain torch model, ``{module-name pattern: style}``. A
            pattern is a dotted module path in which ``*`` matches one name component
            (``"blocks.*.attn.q"``); a style is ``"colwise"``, ``"rowwise"``, ``"colwise_rep"``,
            ``"rowwise_rep"``, ``"sequence_parallel"``, ``"replicate"``, a dict
            ``{"style": ..., "input_layouts": ..., "output_layouts": ..., "use_local_output": ...}``
            (layouts ``"replicate"`` or ``"shard(<dim>)"``), or a torch ``ParallelStyle``.
            ``None``: the model's own ``tp_plan`` / ``_tp_plan`` attribute (transformers' key).
    """

    enable_async_tp: bool = False
    plan: Mapping[str, Any] | None = None


@dataclasses.dataclass
class TorchContextParallelConfig:
    """Context-parallel settings: ``ParallelismConfig(cp_size=N, cp_handler=...)``.

    Args:
        cp_comm_strategy: How ring attention exchanges keys and values: ``"allgather"``
            (default) or ``"alltoall"``; default ``PARALLELISM_CONFIG_CP_COMM_STRATEGY``.
    """

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        strategy = _setting(self.cp_comm_strategy, "cp_comm_strategy", str, "allgather")
        if str(strategy).strip().lower() not in CP_COMM_STRATEGIES:
            # Accelerate's wording, which its tests match.
            raise ParallelismConfigError(
                f"Invalid cp_comm_strategy: {strategy}. Must be one of 'allgather' or "
                "'alltoall' (set in TorchContextParallelConfig(cp_comm_strategy=...) or "
                "PARALLELISM_CONFIG_CP_COMM_STRATEGY)."
            )
        self.cp_comm_strategy = _choice("cp_comm_strategy", strategy, CP_COMM_STRATEGIES)


@dataclasses.dataclass
class DeepSpeedSequenceParallelConfig:
    """DeepSpeed ALST/Ulysses settings (``sp_backend="deepspeed"``), kept for configuration files.

    accel's Accelerator refuses ``sp_size > 1``, saying why (``accel.parallelism``).

    Args:
        sp_seq_length: Sequence length when it is fixed.
        sp_seq_length_is_variable: Whether sequences vary in length (default true).
        sp_attn_implementation: Attention the Ulysses wrapper calls (``sdpa``, ``flash_attention_2``).
    """

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None

    def __post_init__(self) -> None:
        self.sp_seq_length = _setting(self.sp_seq_length, "sp_seq_length", int, None)
        self.sp_seq_length_is_variable = bool(
            _setting(self.sp_seq_length_is_variable, "sp_seq_length_is_variable", bool, True)
        )
        self.sp_attn_implementation = _setting(
            self.sp_attn_implementation, "sp_attn_implementation", str, None
        )


@dataclasses.dataclass
class ParallelismConfig:
    """Degrees of data, tensor, context and sequence parallelism (Accelerate's field names).

    ``dp_replicate_size > 1`` with ``dp_shard_size == 1`` is plain DDP; ``dp_shard_size > 1`` is
    FSDP2 (HSDP with ``dp_replicate_size > 1`` too); ``tp_size``/``cp_size`` compose with FSDP2
    through one mesh. Every size ``None`` reads ``PARALLELISM_CONFIG_<FIELD>``, else 1.

    Args:
        dp_replicate_size: Data-parallel replicas (DDP, or HSDP's replicate dimension).
        dp_shard_size: Data-parallel ranks parameters are sharded over (FSDP2).
        tp_size: Tensor-parallel degree.
        cp_size: Context-parallel degree (ring attention over sequence shards; CUDA only).
        cp_backend: ``"torch"`` (``torch.distributed.tensor.experimental.context_parallel``).
        sp_size: Sequence-parallel (Ulysses) degree; refused by accel's Accelerator.
        sp_backend: ``"deepspeed"`` (ALST) or ``"accelerate"``.
        tp_handler: :class:`TorchTensorParallelConfig` (default one when ``tp_size > 1``).
        cp_handler: :class:`TorchContextParallelConfig` (default one when ``cp_size > 1``).
        sp_handler: :class:`DeepSpeedSequenceParallelConfig`.

    Raises:
        ParallelismConfigError: A degree below 1 (other than one ``-1``), an unknown backend, a
            handler of the wrong type, CP with SP, or TP/CP composed with pure DDP.
        accel_state.EnvironmentConfigError: A ``PARALLELISM_CONFIG_*`` variable is malformed.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: DeepSpeedSequenceParallelConfig | None = None
    _mesh: ParallelMesh | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for dim in MESH_ORDER:
            key = f"{dim}_size"
            value = _setting(getattr(self, key), key, int, 1)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ParallelismConfigError(f"{key}={value!r} must be an integer.")
            if value < 1 and value != AUTO:
                raise ParallelismConfigError(
                    f"{key}={value} must be at least 1 (or -1: take the processes the other "
                    "degrees leave)."
                )
            setattr(self, key, value)
        automatic = [f"{dim}_size" for dim in MESH_ORDER if self.size(dim) == AUTO]
        if len(automatic) > 1:
            raise ParallelismConfigError(
                f"{' and '.join(automatic)} are all -1; at most one degree can take the "
                "leftover processes. Give the others explicit sizes."
            )
        self.cp_backend = _choice(
            "cp_backend", _setting(self.cp_backend, "cp_backend", str, "torch"), CP_BACKENDS
        )
        self.sp_backend = _choice(
            "sp_backend", _setting(self.sp_backend, "sp_backend", str, "deepspeed"), SP_BACKENDS
        )
        self._check_handler("tp_handler", TorchTensorParallelConfig)
        self._check_handler("cp_handler", TorchContextParallelConfig)
        self._check_handler("sp_handler", DeepSpeedSequenceParallelConfig)
        self._fill_handlers()
        self._check_composition()

    # ------------------------------------------------------------------ validation
    def size(self, dim: str) -> int:
        """The degree of dimension ``dim`` (``"tp"``, ``"dp_shard"``...)."""
        return int(getattr(self, f"{dim}_size"))

    def _check_handler(self, field: str, kind: type) -> None:
        handler = getattr(self, field)
        if handler is not None and not isinstance(handler, kind):
            raise ParallelismConfigError(
                f"ParallelismConfig({field}={handler!r}) must be a {kind.__name__}."
            )

    def _fill_handlers(self) -> None:
        """Default handlers for the enabled dimensions (as Accelerate creates them)."""
        if self.tp_size != 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size != 1 and self.cp_handler is None:
            self.cp_handler = TorchContextParallelConfig()
        if self.sp_size != 1 and self.sp_handler is None:
            self.sp_handler = DeepSpeedSequenceParallelConfig()

    def _check_composition(self) -> None:
        """Refuse the combinations Accelerate refuses (checked once no degree is -1)."""
        if self.size("cp") > 1 and self.size("sp") > 1:
            raise ParallelismConfigError(
                f"cp_size={self.cp_size} and sp_size={self.sp_size}: context parallelism and "
                "sequence parallelism both split the sequence and are mutually exclusive; set "
                "one of them to 1."
            )
        if AUTO in (self.dp_replicate_size, self.dp_shard_size, self.tp_size, self.cp_size):
            return
        if (self.size("tp") > 1 or self.size("cp") > 1) and (
            self.size("dp_replicate") > 1 and self.size("dp_shard") == 1
        ):
            raise ParallelismConfigError(
                f"tp_size={self.tp_size}, cp_size={self.cp_size} with "
                f"dp_replicate_size={self.dp_replicate_size} and dp_shard_size=1 composes pure "
                "data parallelism (DDP) with tensor/context parallelism, which is not supported "
                "(DDP cannot reduce the DTensor gradients of a split model). Set "
                "dp_shard_size > 1 and dp_replicate_size=1 for FSDP2 + TP/CP, or both above 1 "
                "for HSDP + TP/CP."
            )

    def describe(self) -> str:
        """Every factor: ``dp_replicate(2) * dp_shard(2) * cp(1) * sp(1) * tp(1)``."""
        return " * ".join(f"{dim}({self.size(dim)})" for dim in MESH_ORDER)

    def resolve(
        self, world_size: int, *, unset_dimension: str = "dp_replicate"
    ) -> ParallelismConfig:
        """Fit the degrees to a job of ``world_size`` processes (in place); returns ``self``.

        A ``-1`` degree takes ``world_size`` divided by the others. When every degree is 1 in a
        job of several processes, ``unset_dimension`` takes them all (``dp_replicate``: DDP, as
        in Accelerate; ``dp_shard`` under FSDP).

        Raises:
            ParallelismConfigError: The product of the degrees is not ``world_size`` (the message
                prints every factor), or the resolved degrees compose what is refused.
        """
        if unset_dimension not in MESH_ORDER:
            raise ParallelismConfigError(
                f"unset_dimension={unset_dimension!r}; choose one of {', '.join(MESH_ORDER)}."
            )
        automatic = [dim for dim in MESH_ORDER if self.size(dim) == AUTO]
        if automatic:
            others = math.prod(self.size(dim) for dim in MESH_ORDER if dim not in automatic)
            if world_size % others:
                raise ParallelismConfigError(
                    f"Invalid parallel dims: {self.describe()} with {automatic[0]}=-1: the "
                    f"other degrees multiply to {others}, which does not divide "
                    f"WORLD_SIZE({world_size}). Choose degrees whose product divides it."
                )
            setattr(self, f"{automatic[0]}_size", world_size // others)
        elif self.total_size == 1 and world_size > 1:
            setattr(self, f"{unset_dimension}_size", world_size)
        if self.total_size != world_size:
            raise ParallelismConfigError(
                f"Invalid parallel dims: {self.describe()} = {self.total_size} != "
                f"WORLD_SIZE({world_size}). Adjust dp_replicate_size/dp_shard_size/tp_size/"
                f"cp_size/sp_size so that they multiply to {world_size} (one of them may be -1 "
                "to take the processes the others leave)."
            )
        self._fill_handlers()
        self._check_composition()
        return self

    # ------------------------------------------------------------------ dimension names
    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled dimensions the data is split over (``dp_replicate``, ``dp_shard``)."""
        return [dim for dim in ("dp_replicate", "dp_shard") if self.size(dim) > 1]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose ranks receive the same batch (``tp``, ``cp``, ``sp``)."""
        return [dim for dim in ("tp", "cp", "sp") if self.size(dim) > 1]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions flattened into ``dp_shard_cp``, the FSDP shard dimension."""
        return [dim for dim in ("dp_shard", "cp", "sp") if self.size(dim) > 1]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions flattened into ``dp_cp``, the ones the loss is averaged over."""
        return [dim for dim in ("dp_replicate", "dp_shard", "cp", "sp") if self.size(dim) > 1]

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The FSDP mesh: ``["dp_replicate", "dp_shard_cp"]`` (HSDP) or ``["dp_shard_cp"]``."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        """Every enabled dimension, data-parallel ones first (Accelerate's order)."""
        return self.dp_dim_names + self.non_dp_dim_names

    def mesh_layout(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Names and sizes of the enabled dimensions in mesh order (empty when none is)."""
        dims = [dim for dim in MESH_ORDER if self.size(dim) > 1]
        return tuple(dims), tuple(self.size(dim) for dim in dims)

    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Accelerate's private name for :meth:`mesh_layout` (``(dim_names, sizes)``)."""
        return self.mesh_layout()

    # ------------------------------------------------------------------ sizes
    @property
    def total_size(self) -> int:
        """The product of every degree (the world size the config needs)."""
        return math.prod(self.size(dim) for dim in MESH_ORDER)

    @property
    def fully_given(self) -> bool:
        """Whether no degree is ``-1`` (the config alone fixes the world size it needs)."""
        return AUTO not in (self.size(dim) for dim in MESH_ORDER)

    @property
    def non_data_parallel_size(self) -> int:
        """``tp_size * cp_size * sp_size``: ranks sharing one batch."""
        return self.size("tp") * self.size("cp") * self.size("sp")

    @property
    def data_parallel_size(self) -> int:
        """``dp_replicate_size * dp_shard_size``: distinct batches per step."""
        return self.size("dp_replicate") * self.size("dp_shard")

    @property
    def dp_replicate_enabled(self) -> bool:
        """``dp_replicate_size > 1``."""
        return self.size("dp_replicate") > 1

    @property
    def dp_shard_enabled(self) -> bool:
        """``dp_shard_size > 1``."""
        return self.size("dp_shard") > 1

    @property
    def tp_enabled(self) -> bool:
        """``tp_size > 1``."""
        return self.size("tp") > 1

    @property
    def cp_enabled(self) -> bool:
        """``cp_size > 1``."""
        return self.size("cp") > 1

    @property
    def sp_enabled(self) -> bool:
        """``sp_size > 1``."""
        return self.size("sp") > 1

    @property
    def shards_parameters(self) -> bool:
        """Whether FSDP2 shards parameters (``dp_shard``, ``cp`` or ``sp`` above 1)."""
        return bool(self.dp_shard_cp_dim_names)

    # ------------------------------------------------------------------ meshes (Accelerate's API)
    def build_device_mesh(self, device_type: str) -> Any:
        """Build (collective: every rank) and return the ``DeviceMesh`` of the enabled dimensions.

        The flattened ``dp``, ``dp_shard_cp`` and ``dp_cp`` meshes are made with it. ``None``
        when no dimension is enabled.
        """
        from accel_state.device_mesh import ParallelMesh

        self._mesh = ParallelMesh(self, device_type)
        return self._mesh.world_mesh

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh built for ``device_type`` (built now when it is not yet).

        Raises:
            ParallelismConfigError: Not built and no ``device_type`` given, or built for another
                device type.
        """
        if self._mesh is None:
            if device_type is None:
                raise ParallelismConfigError(
                    "get_device_mesh() needs device_type (e.g. 'cuda' or 'cpu') to build the mesh."
                )
            return self.build_device_mesh(device_type)
        if device_type is not None and device_type != self._mesh.device_type:
            raise ParallelismConfigError(
                f"The device mesh was built for {self._mesh.device_type!r}; "
                f"device_type={device_type!r} does not match."
            )
        return self._mesh.world_mesh

    def get_submesh(self, dim_names: str | Sequence[str]) -> Any:
        """The mesh of ``dim_names``: a dimension, a flattened one (``dp``...) or several.

        Raises:
            ParallelismConfigError: The mesh is not built, or a dimension is not enabled.
        """
        if self._mesh is None:
            raise ParallelismConfigError(
                "The device mesh is not built yet: call build_device_mesh(device_type) first."
            )
        return self._mesh.get_mesh(dim_names)

    @property
    def device_mesh(self) -> Any:
        """The built mesh (``None`` before :meth:`build_device_mesh` or when nothing is enabled)."""
        return None if self._mesh is None else self._mesh.world_mesh

    @property
    def parallel_mesh(self) -> ParallelMesh | None:
        """The :class:`~accel_state.device_mesh.ParallelMesh` built from this config, if any."""
        return self._mesh

    def to_json(self) -> dict[str, Any]:
        """The settings as plain values (handlers as dicts; a plan's styles as their text)."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            if field.name.startswith("_"):
                continue
            value = getattr(self, field.name)
            if dataclasses.is_dataclass(value):
                value = {
                    key: (dict(item) if isinstance(item, Mapping) else item)
                    for key, item in vars(value).items()
                }
                if isinstance(value.get("plan"), Mapping):
                    value["plan"] = {key: str(style) for key, style in value["plan"].items()}
            out[field.name] = value
        return out


__all__ = [
    "AUTO",
    "CP_BACKENDS",
    "CP_COMM_STRATEGIES",
    "MESH_ORDER",
    "SP_BACKENDS",
    "DeepSpeedSequenceParallelConfig",
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
]
