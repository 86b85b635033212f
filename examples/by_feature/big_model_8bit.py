"""Load a model in 8 bits and in 4 bits with bitsandbytes, on the CPU, with a memory budget.

The model is built empty (``init_empty_weights``: no memory), its linear layers become
bitsandbytes' ``Linear8bitLt`` / ``Linear4bit``, and the checkpoint is read one tensor at a time,
each weight quantized as it arrives. With ``max_memory`` too small for the whole model, the
planner sends the last blocks to the disk, stored quantized and brought in for each forward.

    pip install 'accel[bnb]'
    python examples/by_feature/big_model_8bit.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from accel import init_empty_weights
from accel.utils import (
    BnbQuantizationConfig,
    compute_module_sizes,
    has_4bit_bnb_layers,
    load_and_quantize_model,
)
from accel_ckpt import save_model

WIDTH, DEPTH, VOCAB = 512, 6, 1000


class Block(torch.nn.Module):
    """A residual MLP block (never split across devices)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Model(torch.nn.Module):
    """Embedding, blocks, head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = torch.nn.Linear(WIDTH, VOCAB)  # the last child: kept unquantized

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # noqa: D102
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def megabytes(model: torch.nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    torch.manual_seed(0)
    full = Model()
    save_model(full, folder / "checkpoint", max_shard_size="20MB")  # sharded safetensors
    ids = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        reference = full(ids)
    print(
        f"fp32 model: {megabytes(full):.1f} MB in {len(list((folder / 'checkpoint').glob('*.safetensors')))} shards"
    )
    del full

    for name, config in (
        ("8-bit", BnbQuantizationConfig(load_in_8bit=True)),
        (
            "4-bit nf4",
            BnbQuantizationConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="fp32"
            ),
        ),
    ):
        with init_empty_weights():
            model = Model()
        model = load_and_quantize_model(model, config, folder / "checkpoint")
        with torch.no_grad():
            output = model(ids)
        error = float((output - reference).norm() / reference.norm())
        print(
            f"{name}: {megabytes(model):.1f} MB, relative error {error:.4f}, 4-bit layers: {has_4bit_bnb_layers(model)}"
        )

        # Half the quantized size as a CPU budget: the rest goes to the disk, quantized.
        with init_empty_weights():
            sizing = Model()
        quantized = {
            f"blocks.{i}.{fc}.weight": config.target_dtype
            for i in range(DEPTH)
            for fc in ("up", "down")
        }
        budget = compute_module_sizes(sizing, special_dtypes=quantized)[""] // 2
        with init_empty_weights():
            model = Model()
        model = load_and_quantize_model(
            model,
            config,
            folder / "checkpoint",
            device_map="auto",
            max_memory={"cpu": budget},
            no_split_module_classes=["Block"],
            offload_folder=folder / f"offload-{name}",
        )
        with torch.no_grad():
            offloaded = model(ids)
        disk = [key for key, value in model.hf_device_map.items() if value == "disk"]
        print(
            f"  with max_memory={{'cpu': {budget}}}: on disk {disk}; same output: {torch.equal(offloaded, output)}"
        )


if __name__ == "__main__":
    main()
