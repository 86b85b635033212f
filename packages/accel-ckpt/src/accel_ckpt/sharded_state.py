"""State that every process writes its own part of, inside an atomic checkpoint folder.

Strategies that shard a model (FSDP through ``torch.distributed.checkpoint``, DeepSpeed through
its engine) supply a :class:`ShardedState`; :func:`accel_ckpt.save_state` calls its ``save`` on
every process with a subfolder of the checkpoint before it is published, so a crash mid-save
leaves the previous checkpoint as it was. accel-ckpt never imports those libraries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

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
