"""Shard a model over the processes with FSDP and track the memory each process peaks at.

``FullyShardedDataParallelPlugin`` (or ``accel launch --use_fsdp --fsdp_*``) makes ``prepare``
shard every parameter, gradient and optimizer state: each process holds 1/N of them and gathers
a layer's full weights only while computing it. The loop is unchanged. ``PeakMemory`` measures
each epoch: on a GPU torch's allocator statistics, on a CPU the process's resident memory
sampled in a thread (psutil). ``get_state_dict`` gathers the full weights when they are needed.

    accel launch --cpu --num_processes 2 examples/by_feature/fsdp_with_peak_mem_tracking.py
"""

from __future__ import annotations

import argparse
import threading
from types import TracebackType

import psutil
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, FullyShardedDataParallelPlugin
from accel.utils import set_seed

MB = 2**20


class PeakMemory:
    """Memory in use when the block starts and at its peak, in MB (GPU allocator or CPU RSS)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.process = psutil.Process()
        self.begin = self.peak = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _used(self) -> float:
        if self.cuda:
            return torch.cuda.memory_allocated() / MB
        return self.process.memory_info().rss / MB

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.begin = self.peak = self._used()
        if not self.cuda:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.cuda:
            self.peak = torch.cuda.max_memory_allocated() / MB
        self.peak = max(self.peak, self._used())


class Block(torch.nn.Module):
    """A residual MLP block: FSDP's unit of sharding here."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return x + self.down(torch.relu(self.up(x)))


def local_numel(parameter: torch.Tensor) -> int:
    """Elements of a parameter this process holds (its shard under FSDP2)."""
    to_local = getattr(parameter, "to_local", None)
    return int(to_local().numel() if to_local is not None else parameter.numel())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    args = parser.parse_args()
    set_seed(0)
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        state_dict_type="FULL_STATE_DICT",
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    data = load_digits()
    features = torch.tensor(data.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train, test = order[:1400], order[1400:]
    model = torch.nn.Sequential(
        torch.nn.Linear(64, args.width),
        *(Block(args.width) for _ in range(4)),
        torch.nn.Linear(args.width, 10),
    )
    total = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, train_loader, test_loader = accelerator.prepare(
        model,
        optimizer,
        DataLoader(TensorDataset(features[train], labels[train]), batch_size=32, shuffle=True),
        DataLoader(TensorDataset(features[test], labels[test]), batch_size=64),
    )
    held = sum(local_numel(p) for p in model.parameters())
    print(f"process {accelerator.process_index} holds {held} of {total} parameters", flush=True)
    for epoch in range(args.epochs):
        model.train()
        with PeakMemory(accelerator.device) as memory:
            for batch, targets in train_loader:
                loss = torch.nn.functional.cross_entropy(model(batch), targets)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        accelerator.print(
            f"epoch {epoch}: memory at start {memory.begin:.0f} MB, peak {memory.peak:.0f} MB "
            f"(+{memory.peak - memory.begin:.1f} MB)"
        )
    model.eval()
    correct = count = 0
    with torch.no_grad():
        for batch, targets in test_loader:
            predictions, targets = accelerator.gather_for_metrics(
                (model(batch).argmax(-1), targets)
            )
            correct += int((predictions == targets).sum())
            count += len(targets)
    weights = accelerator.get_state_dict(model)  # full tensors (on the main process)
    if accelerator.is_main_process:
        print(f"gathered state dict: {sum(w.numel() for w in weights.values())} parameters")
    accelerator.print(f"test accuracy {correct / count:.4f}")
    accelerator.wait_for_everyone()  # every collective done before the group is torn down
    accelerator.end_training()


if __name__ == "__main__":
    main()
