"""Read a checkpoint file on one process and broadcast what it holds to the others.

Files every process needs identically (a replicated model's weights, an optimizer, a scheduler...)
are read once per job instead of once per process: process ``source`` runs the reader, then
sends a JSON header (the value's structure from :mod:`accel_ckpt.tree_codec`, each tensor's dtype
and shape) and the tensors' bytes, in buffers of at most ``batch_bytes``. No pickle travels: a
value the tree codec cannot describe (only files loaded with ``allow_pickle=True`` hold such
values) goes as ``torch.save`` bytes that receivers load with the same restrictions as the file
(``weights_only`` unless ``allow_pickle``).

An error on the reading process (missing or corrupt file, refused pickle) travels in the header,
so every process raises at once: the same :mod:`accel_ckpt.errors` class when it has one, else
:class:`DistributedCheckpointError`, naming the reading process and its message.

Headers go over the checkpoint's own gloo group; tensor bytes over the same group on the CPU, or
over the default group on its device where that group is NCCL (tensors then cross on the GPU).
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from accel_ckpt import errors
from accel_ckpt._coordination import Coordinator
from accel_ckpt.errors import (
    AccelCkptError,
    DistributedCheckpointError,
    InvalidArgumentError,
    StateDictMismatchError,
    UnsupportedValueError,
)
from accel_ckpt.tree_codec import decode_tree, encode_tree

#: Largest buffer one broadcast moves (and the most extra memory it needs, on its device).
DEFAULT_BATCH_BYTES = 64 * 1024 * 1024
_PICKLE_NAME = "$pickle"


@dataclass(frozen=True)
class SharedReads:
    """Where shared reads happen and how their bytes travel.

    Attributes:
        rank: This process's rank.
        world_size: Number of processes.
        group: Gloo group for headers (and tensor bytes on the CPU).
        tensor_group: Group for tensor bytes (``None``: the default group).
        device: Device of the tensor broadcast buffers.
        source: Rank that reads the files.
        batch_bytes: Largest buffer per broadcast.

    """

    rank: int
    world_size: int
    group: Any
    tensor_group: Any
    device: torch.device
    source: int = 0
    batch_bytes: int = DEFAULT_BATCH_BYTES

    def __post_init__(self) -> None:
        if self.batch_bytes < 1:
            raise InvalidArgumentError(
                f"batch_bytes={self.batch_bytes!r} must be at least 1; pass a buffer size in "
                f"bytes (default {DEFAULT_BATCH_BYTES})."
            )
        if not 0 <= self.source < self.world_size:
            raise InvalidArgumentError(
                f"source={self.source!r} is not a rank of this {self.world_size}-process job; "
                "pass a rank from 0 to world_size - 1."
            )

    @staticmethod
    def job_has_peers() -> bool:
        """Whether the default process group is initialised with two processes or more."""
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() >= 2

    @classmethod
    def current(
        cls,
        source: int = 0,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        coordinator: Coordinator | None = None,
    ) -> SharedReads | None:
        """For the initialised default process group; ``None`` with a single process.

        Headers travel over ``coordinator``'s checkpoint group (by default the one
        :meth:`Coordinator.current` gives, as the save protocol uses).
        """
        if not cls.job_has_peers():
            return None
        group = (coordinator or Coordinator.current()).group
        if "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available():
            device, tensor_group = torch.device("cuda", torch.cuda.current_device()), None
        else:
            device, tensor_group = torch.device("cpu"), group
        return cls(
            dist.get_rank(),
            dist.get_world_size(),
            group,
            tensor_group,
            device,
            source=source,
            batch_bytes=batch_bytes,
        )

    @property
    def reads(self) -> bool:
        """Whether this process is the one that reads the files."""
        return self.rank == self.source

    def read(
        self,
        read: Callable[[], Any],
        what: str,
        *,
        targets: Mapping[str, torch.Tensor] | None = None,
        allow_pickle: bool = False,
        safe_globals: Sequence[Any] = (),
    ) -> Any:
        """``read()`` on the source process, its result on every process (collective).

        Args:
            read: Reads the file(s); only called on the source process.
            what: Names the file in errors.
            targets: Tensors to receive into, by the name :func:`encode_tree` gives the value's
                tensors, where device, dtype and shape fit (like the file readers' targets).
            allow_pickle: Receivers may unpickle any class (only for a value that needed the
                full unpickler on the source; see the module docstring).
            safe_globals: Extra classes the restricted unpickler may rebuild.

        Raises:
            Whatever ``read`` raised: the same exception on the source, and on the others the
            same :mod:`accel_ckpt.errors` class (else :class:`DistributedCheckpointError`).

        """
        if self.reads:
            return self._send(read, what)
        return self._receive(what, targets or {}, allow_pickle, safe_globals)

    def _send(self, read: Callable[[], Any], what: str) -> Any:
        try:
            value = read()
            tree, tensors = _encode(value, what)
        except Exception as error:
            self._broadcast_header(
                {
                    "ok": False,
                    "type": type(error).__name__,
                    "error": str(error),
                    "missing": list(getattr(error, "missing_keys", [])),
                    "unexpected": list(getattr(error, "unexpected_keys", [])),
                }
            )
            raise
        specs = [[name, str(t.dtype).removeprefix("torch."), list(t.shape)] for name, t in tensors]
        self._broadcast_header({"ok": True, "tree": tree, "tensors": specs})
        self._move([t.detach().contiguous() for _, t in tensors], sending=True)
        return value

    def _receive(
        self,
        what: str,
        targets: Mapping[str, torch.Tensor],
        allow_pickle: bool,
        safe_globals: Sequence[Any],
    ) -> Any:
        header = self._broadcast_header(None)
        if not header["ok"]:
            raise _remote_error(header, what, self.source)
        tensors: dict[str, torch.Tensor] = {}
        for name, dtype_name, shape in header["tensors"]:
            dtype = getattr(torch, dtype_name, None)
            if not isinstance(dtype, torch.dtype):
                raise DistributedCheckpointError(f"{what}: process {self.source} sent {dtype_name}")
            target = targets.get(name)
            fits = (
                target is not None
                and target.device in (self.device, torch.device("cpu"))
                and target.dtype == dtype
                and list(target.shape) == shape
                and target.is_contiguous()
                and target.layout == torch.strided
            )
            tensors[name] = target if fits else torch.empty(shape, dtype=dtype)  # type: ignore[assignment]
        self._move(list(tensors.values()), sending=False)
        bump = getattr(torch.autograd.graph, "increment_version", None)
        if bump is not None:
            for name, tensor in tensors.items():
                if targets.get(name) is tensor:
                    bump(tensor)
        if _PICKLE_NAME in tensors and header["tree"] == {"$tensor": _PICKLE_NAME}:
            return _unpickle(tensors[_PICKLE_NAME], what, allow_pickle, safe_globals, self.source)
        return decode_tree(header["tree"], tensors, what)

    def _broadcast_header(self, header: dict[str, Any] | None) -> Any:
        """JSON over the gloo group: its length, then its bytes."""
        if header is not None:
            data = json.dumps(header, allow_nan=True).encode()
            length = torch.tensor([len(data)], dtype=torch.int64)
        else:
            length = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(length, self.source, group=self.group)
        if header is not None:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            payload = torch.empty(int(length.item()), dtype=torch.uint8)
        dist.broadcast(payload, self.source, group=self.group)
        if header is not None:
            return header
        return json.loads(payload.numpy().tobytes().decode())

    @torch.no_grad()
    def _move(self, tensors: list[torch.Tensor], *, sending: bool) -> None:
        """Broadcast the tensors' bytes in buffers of at most ``batch_bytes``."""
        batch: list[torch.Tensor] = []
        size = 0
        for tensor in tensors:
            view = tensor.reshape(-1).view(torch.uint8)
            offset = 0
            while offset < view.numel():
                take = min(view.numel() - offset, self.batch_bytes - size)
                batch.append(view[offset : offset + take])
                size += take
                offset += take
                if size == self.batch_bytes:
                    self._flush(batch, size, sending)
                    batch, size = [], 0
        if batch:
            self._flush(batch, size, sending)

    def _flush(self, batch: list[torch.Tensor], size: int, sending: bool) -> None:
        if len(batch) == 1 and batch[0].device == self.device:
            dist.broadcast(batch[0], self.source, group=self.tensor_group)
            return
        buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        offset = 0
        if sending:
            for piece in batch:
                buffer[offset : offset + piece.numel()].copy_(piece)
                offset += piece.numel()
        dist.broadcast(buffer, self.source, group=self.tensor_group)
        if not sending:
            for piece in batch:
                piece.copy_(buffer[offset : offset + piece.numel()])
                offset += piece.numel()


def read_once(
    sharing: SharedReads | None,
    read: Callable[[], Any],
    what: str,
    *,
    targets: Mapping[str, torch.Tensor] | None = None,
    allow_pickle: bool = False,
    safe_globals: Sequence[Any] = (),
) -> Any:
    """``read()`` here when ``sharing`` is ``None`` (one process), else :meth:`SharedReads.read`."""
    if sharing is None:
        return read()
    return sharing.read(
        read, what, targets=targets, allow_pickle=allow_pickle, safe_globals=safe_globals
    )


def _encode(value: Any, what: str) -> tuple[Any, list[tuple[str, torch.Tensor]]]:
    """The tree and tensors of ``value``; ``torch.save`` bytes when the codec refuses it."""
    try:
        tree, tensors = encode_tree(value, what)
        return tree, list(tensors.items())
    except UnsupportedValueError:
        pass
    buffer = io.BytesIO()
    torch.save(value, buffer)
    data = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)
    return {"$tensor": _PICKLE_NAME}, [(_PICKLE_NAME, data)]


def _unpickle(
    data: torch.Tensor, what: str, allow_pickle: bool, safe_globals: Sequence[Any], source: int
) -> Any:
    """Load the source's ``torch.save`` bytes as :func:`~accel_ckpt.pickle_io.load_pickled` would."""
    from accel_ckpt.pickle_io import allowed_globals
    from accel_state.torch_compat import safe_globals as torch_safe_globals

    stream = io.BytesIO(data.numpy().tobytes())
    if allow_pickle:
        return torch.load(stream, map_location="cpu", weights_only=False)
    try:
        with torch_safe_globals([*allowed_globals(), *safe_globals]):
            return torch.load(stream, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise errors.UnsafeCheckpointError(
            f"{what}: the state process {source} read needs code outside the safe allow-list "
            f"({error}); pass allow_pickle=True if you trust the file."
        ) from None


def _remote_error(header: Mapping[str, Any], what: str, source: int) -> Exception:
    """The reading process's error, as raised on the others."""
    message = (
        f"{what}: process {source} reads this file for every process and failed: "
        f"{header['type']}: {header['error']}"
    )
    kind = getattr(errors, str(header["type"]), None)
    if isinstance(kind, type) and issubclass(kind, StateDictMismatchError):
        return kind(message, header.get("missing", ()), header.get("unexpected", ()))
    if isinstance(kind, type) and issubclass(kind, AccelCkptError):
        return kind(message)
    return DistributedCheckpointError(message)
