"""Run a model larger than the memory you give it: empty init, a device map, offload, dispatch.

Three steps, as for a checkpoint too large to load twice: build the model on the ``meta`` device
with ``init_empty_weights`` (no memory), plan where each block goes with
``infer_auto_device_map`` under a memory budget (GPUs first, then the CPU, then the disk), and
``load_checkpoint_and_dispatch`` to read the checkpoint shard by shard into that plan; blocks
planned for ``"disk"`` are written to ``--offload_folder`` and brought in for each forward.
Here a CPU budget of ``--cpu_budget`` bytes keeps part of the model on disk; the script checks
that the dispatched model computes the same outputs as the model it saved. One process:

    python examples/by_feature/big_model_inference.py --cpu_budget 8MB
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from accel import Accelerator, init_empty_weights, load_checkpoint_and_dispatch
from accel.utils import infer_auto_device_map, set_seed


class Block(torch.nn.Module):
    """A residual MLP block: kept whole on one device (no_split_module_classes)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Model(torch.nn.Module):
    """An input layer, ``depth`` blocks and a head: 16 MB of float32 weights by default."""

    def __init__(self, width: int = 256, depth: int = 8) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(16, width)
        self.blocks = torch.nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = torch.nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.head(self.blocks(self.embed(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu_budget", default="8MB", help="memory the CPU may hold for weights")
    parser.add_argument("--offload_folder", default=None, help="default: a temporary folder")
    args = parser.parse_args()
    set_seed(0)
    accelerator = Accelerator()
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = Path(scratch) / "checkpoint"
        offload = Path(args.offload_folder or Path(scratch) / "offload")
        reference = Model().eval()
        # A sharded safetensors checkpoint with an index, as large models ship.
        accelerator.save_model(reference, checkpoint, max_shard_size="4MB")
        size = sum(p.numel() * p.element_size() for p in reference.parameters())
        accelerator.print(
            f"model: {size / 2**20:.1f} MB in {len(list(checkpoint.glob('*.safetensors')))} shards"
        )

        with init_empty_weights():  # parameters on the meta device: no memory used
            model = Model()
        device_map = infer_auto_device_map(
            model, max_memory={"cpu": args.cpu_budget}, no_split_module_classes=["Block"]
        )
        where = {
            device: [name for name, d in device_map.items() if d == device]
            for device in set(device_map.values())
        }
        accelerator.print(f"device map: {device_map}")
        model = load_checkpoint_and_dispatch(
            model, checkpoint, device_map=device_map, offload_folder=offload
        )
        inputs = torch.randn(32, 16)
        with torch.no_grad():
            expected = reference(inputs)
            output = model(inputs)
        difference = (output - expected).abs().max().item()
        accelerator.print(
            f"{len(where.get('cpu', []))} modules on the CPU, {len(where.get('disk', []))} "
            f"offloaded to disk ({len(list(offload.glob('*')))} files in the offload folder)"
        )
        accelerator.print(f"max difference from the saved model's outputs: {difference:.2e}")


if __name__ == "__main__":
    main()
