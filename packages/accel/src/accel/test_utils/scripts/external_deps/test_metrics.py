"""Distributed evaluation gives the metric a single process gives (needs Hugging Face ``datasets``).

A ``datasets.Dataset`` of a length that does not split evenly over the processes is evaluated
with a fixed classifier: every process predicts its shard, and
:meth:`~accel.Accelerator.gather_for_metrics` collects predictions and labels without the samples
repeated to even out the last batch. The accuracy must equal the one computed over the whole
dataset in one process, and every sample must be counted once.

Run with ``debug_launcher(test_metrics.main)``, ``accel launch test_metrics.py`` or
``python test_metrics.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from accel import Accelerator
from accel.state import AcceleratorState, GradientState, PartialState


def _dataset(length: int) -> Any:
    from datasets import Dataset

    ids = list(range(length))
    return Dataset.from_dict(
        {"id": ids, "x": [float(i % 7) for i in ids], "label": [i % 2 for i in ids]}
    )


def _predict(x: torch.Tensor) -> torch.Tensor:
    """A fixed classifier: right on most samples, wrong on some."""
    return (x.round().long() % 2 == 1).long() if x.numel() else x.long()


def _collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    return {key: torch.tensor([row[key] for row in rows]) for key in ("id", "x", "label")}


def check_metrics(batch_size: int, split_batches: bool) -> None:
    """Distributed accuracy equals one-process accuracy; each sample is counted once."""
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    from accel.utils import DataLoaderConfiguration

    accelerator = Accelerator(
        dataloader_config=DataLoaderConfiguration(split_batches=split_batches)
    )
    n = accelerator.num_processes
    length = 5 * n * batch_size + 3
    dataset = _dataset(length)
    reference_loader = DataLoader(dataset, batch_size=batch_size, collate_fn=_collate)
    correct = total = 0
    for batch in reference_loader:
        correct += int((_predict(batch["x"]) == batch["label"]).sum())
        total += len(batch["label"])

    loader = accelerator.prepare(
        DataLoader(
            dataset, batch_size=batch_size * (n if split_batches else 1), collate_fn=_collate
        )
    )
    ids: list[int] = []
    dist_correct = 0
    for batch in loader:
        predictions = _predict(batch["x"])
        predictions, labels, batch_ids = accelerator.gather_for_metrics(
            (predictions, batch["label"], batch["id"])
        )
        dist_correct += int((predictions == labels).sum())
        ids += batch_ids.cpu().tolist()
    if sorted(ids) != list(range(length)):
        raise AssertionError(
            f"gather_for_metrics counted {len(ids)} samples of {length} (duplicates or losses): "
            f"split_batches={split_batches}, batch_size={batch_size}, {n} processes"
        )
    if dist_correct / length != correct / total:
        raise AssertionError(
            f"distributed accuracy {dist_correct}/{length} differs from one-process accuracy "
            f"{correct}/{total}"
        )


def main() -> None:
    """Run the checks on this process (collective ones on every process of the job)."""
    state = PartialState()
    for batch_size, split_batches in ((2, False), (3, False), (2, True)):
        state.print(f"test_metrics: batch_size={batch_size}, split_batches={split_batches}")
        check_metrics(batch_size, split_batches)
    state.wait_for_everyone()
    state.print("test_metrics: all checks passed")


if __name__ == "__main__":
    main()
