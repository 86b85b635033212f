r"""Train a small transformer with N-D parallelism: FSDP2 x tensor parallelism (or HSDP) on one mesh.

The model is a plain ``nn.Module`` that carries its tensor-parallel plan (``tp_plan``, the
attribute transformers models have): attention and MLP projections split Megatron-style. The
loop is the ordinary one; only the Accelerator gets a ``ParallelismConfig``. The data (token
sequences that count upwards, with noise) is generated, nothing is downloaded.

On 4 CPU processes, FSDP2 over 2 ranks x tensor parallelism over 2:

    accel launch --cpu --num_processes 4 examples/by_feature/nd_parallel.py --dp_shard_size 2 --tp_size 2

or with the sizes given to the launcher instead (Accelerate's flags), e.g. HSDP:

    accel launch --cpu --num_processes 4 --parallelism_config_dp_replicate_size 2 \\
        --parallelism_config_dp_shard_size 2 examples/by_feature/nd_parallel.py

Each epoch ends with an evaluation (``gather_for_metrics`` over the data-parallel ranks) and a
checkpoint; ``--resume`` continues from the newest one, on any layout of the same world size or
another one (``save_state`` writes DTensors through torch.distributed.checkpoint).
"""

from __future__ import annotations

import argparse
import math
from typing import ClassVar

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, ParallelismConfig
from accel.utils import ProjectConfiguration, set_seed

VOCAB, SEQ = 64, 32


class Attention(torch.nn.Module):
    """Causal self-attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.k = torch.nn.Linear(dim, dim, bias=False)
        self.v = torch.nn.Linear(dim, dim)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over the earlier positions."""
        batch, length, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            # -1: the heads this rank holds (all of them, or 1/tp under tensor parallelism)
            return t.view(batch, length, -1, self.head_dim).transpose(1, 2)

        out = torch.nn.functional.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True
        )
        return self.o(out.transpose(1, 2).reshape(batch, length, -1))


class Block(torch.nn.Module):
    """Pre-norm attention and MLP, each with a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One block."""
        x = x + self.attn(self.norm1(x))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class TinyLM(torch.nn.Module):
    """Token and position embeddings, blocks, a head."""

    # How to split it over the mesh's tp dimension ('*' matches one module-name component).
    tp_plan: ClassVar[dict[str, str]] = {
        "blocks.*.attn.q": "colwise",
        "blocks.*.attn.k": "colwise",
        "blocks.*.attn.v": "colwise",
        "blocks.*.attn.o": "rowwise",
        "blocks.*.up": "colwise",
        "blocks.*.down": "rowwise",
    }

    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, dim)
        self.position = torch.nn.Embedding(SEQ, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits for every position."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def counting_sequences(count: int, seed: int) -> TensorDataset:
    """Sequences that count upwards modulo the vocabulary, with 10% random tokens."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (count, 1), generator=generator)
    tokens = (start + torch.arange(SEQ + 1)) % VOCAB
    noise = torch.rand(tokens.shape, generator=generator) < 0.1
    tokens[noise] = torch.randint(0, VOCAB, (int(noise.sum()),), generator=generator)
    return TensorDataset(tokens)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="N-D parallel training with accel.")
    for dim in ("dp_replicate", "dp_shard", "tp"):
        parser.add_argument(f"--{dim}_size", type=int, default=None, help=f"{dim} degree")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32, help="total batch per step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--project_dir", default="runs/nd_parallel")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    sizes = {
        name: getattr(args, name)
        for name in ("dp_replicate_size", "dp_shard_size", "tp_size")
        if getattr(args, name) is not None
    }
    accelerator = Accelerator(
        # None: the launcher's --parallelism_config_* settings (or none at all).
        parallelism_config=ParallelismConfig(**sizes) if sizes else None,
        project_config=ProjectConfiguration(
            project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2
        ),
    )
    set_seed(0)
    # Each data-parallel rank reads its share of the batch; tp ranks of one group read the same.
    per_rank = args.batch_size // accelerator.state.partial.data_parallel_size
    train = DataLoader(counting_sequences(512, 1), batch_size=per_rank, shuffle=True)
    test = DataLoader(counting_sequences(128, 2), batch_size=per_rank)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train, test = accelerator.prepare(model, optimizer, train, test)
    accelerator.print(
        f"mesh {accelerator.torch_device_mesh}; strategy: {accelerator.strategy.name}; "
        f"{accelerator.state.partial.data_parallel_size} data-parallel ranks"
    )
    if args.resume:
        accelerator.load_state()
    start = int(train.iteration) if args.resume else 0
    for epoch in range(start, args.epochs):
        model.train()
        for (tokens,) in train:
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
            )
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)  # over every mesh dimension
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        losses = []
        with torch.no_grad():
            for (tokens,) in test:
                logits = model(tokens[:, :-1])
                loss = (
                    torch.nn.functional.cross_entropy(
                        logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1), reduction="none"
                    )
                    .view(tokens.shape[0], -1)
                    .mean(dim=1)
                )
                losses.append(accelerator.gather_for_metrics(loss))
        mean = torch.cat(losses).mean().item()
        accelerator.print(f"epoch {epoch}: test loss {mean:.3f}, perplexity {math.exp(mean):.2f}")
        accelerator.save_state()
    accelerator.save_model(model, f"{args.project_dir}/model")  # the full weights
    accelerator.end_training()


if __name__ == "__main__":
    main()
