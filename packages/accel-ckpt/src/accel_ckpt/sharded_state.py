"""State that every process writes its own part of, inside an atomic checkpoint folder.

Strategies that shard a model (FSDP through ``torch.distributed.checkpoint``, DeepSpeed through
its engine) supply a :class:`ShardedState`; :func:`accel_ckpt.save_state` calls its ``save`` on
every process with a subfolder of the checkpoint before it is published, so a crash mid-save
leaves the previous checkpoint as it was. accel-ckpt never imports those libraries.

A state that can also :meth:`StageableShardedState.stage` itself (copy its tensors into host
memory and return the write as a function) is written in the background by
``save_state(blocking=False)``: the call returns once every process has staged, and the write runs
on the save's background thread over the checkpoint's own gloo group, so its collectives never
interleave with the training loop's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from accel_ckpt.errors import InvalidArgumentError

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@runtime_checkable
class ShardedState(Protocol):
    """A piece of training state written collectively by every process.

    Attributes:
        name: Its subfolder in the checkpoint (letters, digits, ``_``, ``-``, ``.``), unique
            within one ``save_state`` call, e.g. ``"fsdp_model_0"`` or ``"deepspeed"``.
    """

    name: str

    def save(self, folder: Path) -> Mapping[str, tuple[int, int]] | None:
        """Write this process's part into ``folder`` (called on every process; it exists).

        Returns:
            Optionally, the files this process wrote completely and fsynced: path relative to
            ``folder`` -> ``(size, crc32)`` (see :func:`accel_ckpt.dcp_writer.checksummed_writer`
            for ``torch.distributed.checkpoint``). Files it does not list are fsynced and
            checksummed by the committing process, which reads them back; ``None`` leaves all
            of them to it.
        """

    def load(self, folder: Path) -> None:
        """Read the state back from ``folder`` (called on every process)."""


#: The write of a staged sharded state: ``write(folder, process_group)`` returns what
#: :meth:`ShardedState.save` returns. ``process_group`` is the gloo group to run its collectives
#: on (``None`` with a single process).
StagedWrite = Callable[[Path, Any], Mapping[str, tuple[int, int]] | None]


@runtime_checkable
class StageableShardedState(ShardedState, Protocol):
    """A :class:`ShardedState` whose write can run in the background (``blocking=False``)."""

    def stage(self) -> StagedWrite:
        """Copy this process's part into host memory (collective: called on every process).

        Returns:
            The write, run later on a background thread; it must touch only the staged copies
            (training goes on meanwhile) and run its collectives on the group it is given.
        """


def check_sharded_states(states: Sequence[object]) -> list[ShardedState]:
    """Validate what was passed as ``sharded_states``.

    Raises:
        InvalidArgumentError: An entry lacks ``name``/``save``/``load``, has an unusable name, or
            two entries share a name.
    """
    checked: list[ShardedState] = []
    seen: set[str] = set()
    for index, state in enumerate(states):
        if not isinstance(state, ShardedState):
            raise InvalidArgumentError(
                f"sharded_states[{index}] ({type(state).__name__}) needs a name attribute and "
                "save(folder) and load(folder) methods."
            )
        name = state.name
        if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name):
            raise InvalidArgumentError(
                f"sharded_states[{index}].name={name!r} must be a plain folder name (letters, "
                "digits, '_', '-', '.')."
            )
        if name in seen:
            raise InvalidArgumentError(
                f"sharded_states[{index}].name={name!r} is used twice; give each a unique name."
            )
        seen.add(name)
        checked.append(state)
    return checked
