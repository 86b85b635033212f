"""N-D parallelism through the Accelerator vs the same mesh by hand, 4 gloo processes.

Both variants train the same transformer-style model on a ``dp_shard 2 x tp 2`` mesh: by hand,
``init_device_mesh`` + ``parallelize_module`` (attention and MLP split column-/row-wise) +
``fully_shard`` of every block, then the root, over ``dp_shard``; through the Accelerator,
``ParallelismConfig(dp_shard_size=2, tp_size=2)`` with the model's ``tp_plan`` and an FSDP plugin
wrapping the same blocks. The same processes alternate hand (A) and Accelerator (B) rounds (A B,
then B A) on the same batches; we report the median time per step and the median of the
per-round ratios B/A (target <= 1.03). ``--layout hsdp`` compares HSDP (``dp_replicate 2 x
dp_shard 2``) instead.

Run: ``python benchmarks/bench_nd.py [--rounds 7] [--steps 8] [--layout tp|hsdp]``.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch
import torch.distributed as dist
from paired_steps import alternating_step_times

from accel import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig
from accel_state.testing import spawn_workers

VOCAB, DIM, HEADS, SEQ, BLOCKS, BATCH = 512, 256, 8, 32, 4, 8
PLAN = {
    "blocks.*.q": "colwise",
    "blocks.*.k": "colwise",
    "blocks.*.v": "colwise",
    "blocks.*.o": "rowwise",
    "blocks.*.up": "colwise",
    "blocks.*.down": "rowwise",
}
LAYOUTS = {
    "tp": {"dp_shard_size": 2, "tp_size": 2},
    "hsdp": {"dp_replicate_size": 2, "dp_shard_size": 2},
}


class Block(torch.nn.Module):
    """Pre-norm causal self-attention and MLP with residuals."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(DIM)
        self.q = torch.nn.Linear(DIM, DIM)
        self.k = torch.nn.Linear(DIM, DIM, bias=False)
        self.v = torch.nn.Linear(DIM, DIM)
        self.o = torch.nn.Linear(DIM, DIM)
        self.norm2 = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, 4 * DIM)
        self.down = torch.nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One block (the head count follows the local projection width under TP)."""
        batch, length, _ = x.shape
        h = self.norm1(x)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, -1, DIM // HEADS).transpose(1, 2)

        attended = torch.nn.functional.scaled_dot_product_attention(
            heads(self.q(h)), heads(self.k(h)), heads(self.v(h)), is_causal=True
        )
        x = x + self.o(attended.transpose(1, 2).reshape(batch, length, -1))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class Model(torch.nn.Module):
    """Embedding, blocks, head; carries its tensor-parallel plan."""

    tp_plan = PLAN

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(BLOCKS)])
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits for every position."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model() -> Model:
    torch.manual_seed(0)
    return Model()


def loss_of(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def hand_setup(layout: str) -> tuple[torch.nn.Module, torch.optim.Optimizer, int]:
    """The mesh, the split and the sharding written with torch's own APIs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = make_model()
    if layout == "tp":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        for block in model.blocks:
            plan = {key.split(".")[-1]: styles[style]() for key, style in PLAN.items()}
            parallelize_module(block, mesh["tp"], plan)
        data_mesh = mesh["dp_shard"]
        data_rank = data_mesh.get_local_rank()
    else:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
        data_mesh = mesh
        data_rank = dist.get_rank()
    for block in model.blocks:
        fully_shard(block, mesh=data_mesh)
    fully_shard(model, mesh=data_mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), data_rank


def step_worker(rounds: int, steps: int, layout: str) -> dict[str, Any]:
    """Seconds per training step, by hand and through the Accelerator, alternating."""
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    )
    accelerator = Accelerator(
        parallelism_config=ParallelismConfig(**LAYOUTS[layout]), fsdp_plugin=plugin
    )
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    hand_model, hand_optimizer, data_rank = hand_setup(layout)
    assert data_rank == accelerator.state.partial.data_parallel_process_index
    generator = torch.Generator().manual_seed(data_rank)
    data = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator) for _ in range(steps)]

    times = alternating_step_times(
        accelerator, (model, optimizer), (hand_model, hand_optimizer), loss_of, data, rounds
    )
    same = [
        float(loss_of(model, data[0]).detach()),
        float(loss_of(hand_model, data[0]).detach()),
    ]
    return {"times": times, "losses": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="tp")
    args = parser.parse_args()
    results = spawn_workers(
        step_worker, 4, args=(args.rounds, args.steps, args.layout), timeout=1800
    )
    names = {"tp": "dp_shard 2 x tp 2", "hsdp": "dp_replicate 2 x dp_shard 2"}
    print(
        f"## N-D parallelism ({names[args.layout]}): Accelerator vs parallelize_module + "
        f"fully_shard by hand, 4 gloo processes, {args.rounds} alternating rounds of "
        f"{args.steps} steps, medians"
    )
    print("| metric | hand | accel | accel / hand | target |")
    print("| --- | --- | --- | --- | --- |")
    hand = statistics.median(t for r in results for t in r["times"]["hand"])
    accel = statistics.median(t for r in results for t in r["times"]["accel"])
    times = results[0]["times"]
    ratio = statistics.median(a / h for h, a in zip(times["hand"], times["accel"], strict=True))
    print(f"| wall per step | {hand * 1e3:.2f} ms | {accel * 1e3:.2f} ms | {ratio:.3f} | <= 1.03 |")
    accel_loss, hand_loss = results[0]["losses"]
    print(f"\nloss after training, accel {accel_loss:.6f} / hand {hand_loss:.6f} (same data)")


if __name__ == "__main__":
    main()
