"""Importing a checkpoint folder written by Hugging Face Accelerate's ``save_state``.

So a run can switch libraries mid-training. Accelerate's layout (``_1``, ``_2``... for the second,
third... object of a kind)::

    model.safetensors | pytorch_model.bin     weights of model 0
    optimizer.bin                            optimizer 0 (torch.save pickle)
    scheduler.bin                            scheduler 0 (pickle)
    sampler.bin, dl_state_dict.bin           dataloader 0's sampler / stateful-loader state
    scaler.pt                                gradient scaler (pickle)
    custom_checkpoint_<i>.pkl                registered object i (pickle)
    random_states_<r>.pkl                    RNG states and ``step`` of process r (pickle)

Every file but the safetensors weights is a pickle, which can run code when loaded, so importing
needs ``allow_pickle=True``. There is no manifest: files are read as they are.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from accel_ckpt.errors import CheckpointContentsError, UnsafeCheckpointError
from accel_ckpt.manifest import MANIFEST_NAME, Manifest
from accel_ckpt.model_io import unwrap_model
from accel_ckpt.model_loading import ModelSource, load_model_source
from accel_ckpt.pickle_io import load_pickled
from accel_ckpt.placement import Placer
from accel_ckpt.project import numbered_checkpoints
from accel_ckpt.rng_state import restore_rng_states
from accel_ckpt.stateful import Unwrap

logger = logging.getLogger(__name__)

#: Accelerate's RNG keys -> those of :func:`accel_ckpt.capture_rng_states`.
_RNG_KEYS = {
    "random_state": "python",
    "numpy_random_seed": "numpy",
    "torch_manual_seed": "torch",
    "torch_cuda_manual_seed": "cuda",
    "xm_seed": "xla",
}
_SIGNATURE_FILES = ("optimizer.bin", "scheduler.bin", "scaler.pt", "custom_checkpoint_0.pkl")


def numbered(stem: str, index: int, suffix: str) -> str:
    """Accelerate's name of object ``index``: ``optimizer.bin``, ``optimizer_1.bin``..."""
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"


def is_accelerate_checkpoint(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds an Accelerate ``save_state`` checkpoint (and no accel manifest)."""
    path = Path(folder)
    if not path.is_dir() or (path / MANIFEST_NAME).exists():
        return False
    if any(path.glob("random_states_*.pkl")):
        return True
    return any((path / name).is_file() for name in _SIGNATURE_FILES)


def latest_accelerate_checkpoint(folder: str | os.PathLike[str]) -> tuple[int, Path] | None:
    """The highest-numbered ``checkpoint_<i>`` in ``folder`` written by Accelerate, if any."""
    found = [entry for entry in numbered_checkpoints(folder) if is_accelerate_checkpoint(entry[1])]
    return found[-1] if found else None


def _pickled_files(folder: Path) -> list[str]:
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if entry.is_file() and entry.suffix in (".bin", ".pkl", ".pt")
    )


def refuse_pickles(folder: Path) -> None:
    """Raise the error that names the opt-in for importing ``folder``.

    Raises:
        UnsafeCheckpointError: Always.
    """
    shown = ", ".join(_pickled_files(folder)[:8]) or "none"
    raise UnsafeCheckpointError(
        f"{folder} was written by Hugging Face Accelerate's save_state (it has no "
        f"{MANIFEST_NAME}). Its states are pickle files ({shown}), and loading a pickle can run "
        "arbitrary code. If you trust this folder, import it with load_state(..., "
        "allow_pickle=True) (Accelerator.load_state(input_dir, allow_pickle=True)); the next "
        "save_state writes accel's safe format."
    )


class AccelerateReader:
    """Reads the files of one Accelerate checkpoint folder (after the pickle opt-in).

    Args:
        folder: The checkpoint folder.
        map_location: Device for tensors of optimizers, schedulers and custom objects
            (default: CPU; ``load_state_dict`` moves optimizer states to their parameters).
    """

    def __init__(self, folder: Path, map_location: Any = None) -> None:
        self.folder = folder
        self.map_location = map_location if map_location is not None else "cpu"
        self.contents: dict[str, Any] = {"imported_from": "accelerate"}

    def _require(self, name: str, what: str, stored: str) -> Path:
        path = self.folder / name
        if not path.is_file():
            present = sorted(entry.name for entry in self.folder.iterdir())[:20]
            raise CheckpointContentsError(
                f"{self.folder} has no {name}, so it holds no {what}; it holds {present}. Pass "
                f"load_state the same {stored} as Accelerate's save_state got, in the same order."
            )
        return path

    def state(self, name: str, what: str, stored: str) -> Any:
        """The unpickled contents of file ``name``."""
        path = self._require(name, what, stored)
        self.contents.setdefault("files", []).append(name)
        return load_pickled(path, allow_pickle=True, map_location=self.map_location)

    def load_model(self, model: nn.Module, index: int, strict: bool) -> None:
        """Fill ``model`` (already unwrapped) from ``model[_i].safetensors`` or the ``.bin``."""
        safe = numbered("model", index, ".safetensors")
        name = safe if (self.folder / safe).is_file() else numbered("pytorch_model", index, ".bin")
        path = self._require(name, f"model {index} ({safe} or {name})", "models")
        self.contents.setdefault("files", []).append(name)
        load_model_source(
            model,
            ModelSource([path], name.endswith(".safetensors")),
            Placer(model),
            strict=strict,
            allow_pickle=True,
        )

    def warn_about_dataloaders(self, count: int) -> None:
        """Log that Accelerate's sampler files, if any, are not imported."""
        for index in range(count):
            for name in (
                numbered("sampler", index, ".bin"),
                numbered("dl_state_dict", index, ".bin"),
            ):
                if (self.folder / name).is_file():
                    logger.warning(
                        "%s holds %s, Accelerate's state of dataloader %d; it is not imported "
                        "(its format is Accelerate's own), so that dataloader starts its epoch "
                        "from the beginning: skip what was already seen with "
                        "skip_first_batches(dataloader, num_batches).",
                        self.folder,
                        name,
                        index,
                    )

    def restore_rng(self, rank: int, restore: bool) -> int | None:
        """Return the ``step`` stored with process ``rank``'s generators; restore them if asked."""
        name = f"random_states_{rank}.pkl"
        if not (self.folder / name).is_file():
            logger.warning("%s has no %s; RNG states and step not restored.", self.folder, name)
            return None
        states = self.state(name, f"RNG states of process {rank}", "processes")
        step = states.get("step")
        if not restore:
            return int(step) if isinstance(step, int) else None
        converted = {ours: states[theirs] for theirs, ours in _RNG_KEYS.items() if theirs in states}
        skipped = sorted(set(states) - set(_RNG_KEYS) - {"step"})
        if skipped:
            logger.info("%s: RNG states %s are not restored by accel.", self.folder / name, skipped)
        if "python" in converted and "torch" in converted:
            restore_rng_states(converted, os.fspath(self.folder / name))
        return int(step) if isinstance(step, int) else None


def load_accelerate_state(
    folder: Path,
    *,
    models: Sequence[nn.Module],
    optimizers: Sequence[Any],
    schedulers: Sequence[Any],
    dataloaders: Sequence[Any],
    scaler: Any,
    custom_objects: Sequence[Any],
    strict: bool,
    map_location: Any,
    unwrap: Unwrap | None,
    allow_pickle: bool,
    load_rng_states: bool,
    rank: int,
) -> Manifest:
    """Load an Accelerate checkpoint into the given objects, as Accelerate's ``load_state`` does.

    Returns:
        A manifest describing it: ``metadata["step"]`` is the step Accelerate stored, and
        ``num_processes`` the number of processes that saved it.

    Raises:
        UnsafeCheckpointError: ``allow_pickle`` is False.
        CheckpointContentsError: An object has no file in the folder.
    """
    if not allow_pickle:
        refuse_pickles(folder)
    reader = AccelerateReader(folder, map_location)
    for index, model in enumerate(models):
        reader.load_model(unwrap_model(model, unwrap), index, strict)
    for stem, kind, objects in (
        ("optimizer", "optimizers", optimizers),
        ("scheduler", "schedulers", schedulers),
    ):
        for index, obj in enumerate(objects):
            name = numbered(stem, index, ".bin")
            obj.load_state_dict(reader.state(name, f"{stem} {index}", kind))
    for index, obj in enumerate(custom_objects):
        name = f"custom_checkpoint_{index}.pkl"
        obj.load_state_dict(reader.state(name, f"custom object {index}", "registered objects"))
    if scaler is not None:
        scaler.load_state_dict(reader.state("scaler.pt", "gradient scaler", "mixed precision"))
    reader.warn_about_dataloaders(len(dataloaders))
    step = reader.restore_rng(rank, load_rng_states)
    saved_by = len(list(folder.glob("random_states_*.pkl")))
    return Manifest(
        files={},
        contents=reader.contents,
        num_processes=max(saved_by, 1),
        metadata={} if step is None else {"step": step},
    )
