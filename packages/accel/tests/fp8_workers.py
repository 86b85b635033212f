"""fp8 (torchao) training functions run inside spawned worker processes (importable by name).

A small transformer trains on a learnable token sequence under DDP and FSDP2, in bf16 autocast
and in fp8, the user's way: prepare, train, evaluate under ``no_grad``, ``save_state``, and in
a fresh launch ``load_state`` and go on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from accel import Accelerator, FullyShardedDataParallelPlugin
from accel_state import reset_state

VOCAB, DIM, SEQ, BATCH = 64, 32, 16, 8
STEPS, SAVE_AT, LR = 50, 25, 1e-2


class Block(torch.nn.Module):
    """Pre-norm attention and MLP; ``gate`` (32 -> 8) is too narrow for fp8 matmuls."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.norm2 = torch.nn.LayerNorm(DIM)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(DIM, 2 * DIM), torch.nn.GELU(), torch.nn.Linear(2 * DIM, DIM)
        )
        self.gate = torch.nn.Linear(DIM, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        attention = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention)
        gate = torch.sigmoid(self.gate(x).float().mean(-1, keepdim=True)).to(x.dtype)
        return x + gate * self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    """Embedding, two blocks, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


#: Layers the default filter converts: every linear but the first (blocks.0.qkv) and the last
#: (head), and not the gates (8 outputs: not divisible by 16).
EXPECTED_FP8 = sorted(
    f"blocks.{i}.{name}"
    for i in (0, 1)
    for name in ("qkv", "proj", "mlp.0", "mlp.2")
    if (i, name) != (0, "qkv")
)
EXPECTED_KEPT = ["blocks.0.gate", "blocks.0.qkv", "blocks.1.gate", "head"]


def make_model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM()


def global_batch(step: int) -> torch.Tensor:
    """Tokens of step ``step``: each sequence follows ``next = 5 * token + 3 (mod VOCAB)``, with
    one token in eight replaced at random, so the loss can fall but not to zero."""
    generator = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=generator)
    tokens = [start]
    for _ in range(SEQ):
        tokens.append((5 * tokens[-1] + 3) % VOCAB)
    sequence = torch.cat(tokens, dim=1)
    noise = torch.rand(sequence.shape, generator=generator) < 0.125
    random = torch.randint(0, VOCAB, sequence.shape, generator=generator)
    return torch.where(noise, random, sequence)


def lm_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token loss; the tokens follow the model's device (a GPU run builds them on the CPU)."""
    tokens = tokens.to(next(model.parameters()).device)
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1)
    )


def accelerator_for(strategy: str, precision: str, **kwargs: Any) -> Accelerator:
    """A fresh Accelerator (the process group stays) for ``ddp`` or ``fsdp2``."""
    reset_state(stop_process_group=False)
    if strategy == "fsdp2":
        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=["Block"],
        )
    return Accelerator(mixed_precision=precision, **kwargs)


def layer_kinds(model: torch.nn.Module) -> dict[str, str]:
    """Class name of every linear-like layer, by name (wrapper prefixes removed)."""
    from accel.strategies.fsdp.strategy import clean_name

    return {
        clean_name(name).removeprefix("module."): type(module).__name__
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }


class Run:
    """A prepared model, optimizer and scheduler, and the steps it has trained."""

    def __init__(self, accelerator: Accelerator, accumulation: int = 1) -> None:
        self.accelerator = accelerator
        self.accumulation = accumulation
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        self.model, self.optimizer, self.scheduler = accelerator.prepare(
            model, optimizer, scheduler
        )
        self.step = 0

    def train(self, steps: int) -> list[float]:
        """``steps`` optimizer steps; the global mean loss of each."""
        accelerator = self.accelerator
        rank, world = accelerator.process_index, accelerator.num_processes
        share = BATCH // world
        micro = share // self.accumulation
        losses = []
        self.model.train()
        for _ in range(steps):
            tokens = global_batch(self.step)[rank * share : (rank + 1) * share]
            total = torch.zeros((), device=accelerator.device)
            for index in range(self.accumulation):
                with accelerator.accumulate(self.model):
                    loss = lm_loss(self.model, tokens[index * micro : (index + 1) * micro])
                    accelerator.backward(loss)
                    total += loss.detach() / self.accumulation
                    self.optimizer.step()
                    self.scheduler.step()
                    self.optimizer.zero_grad()
            losses.append(accelerator.reduce(total, reduction="mean").item())
            self.step += 1
        return losses

    def evaluate(self) -> float:
        """The loss on a held-out batch, under ``no_grad`` in eval mode."""
        self.model.eval()
        with torch.no_grad():
            loss = lm_loss(self.model, global_batch(10_000))
        self.model.train()
        return float(self.accelerator.reduce(loss.detach(), reduction="mean").item())


def first_launch(folder: str) -> dict[str, Any]:
    """Per strategy: 50 bf16 steps; 50 fp8 steps with eval + ``save_state`` after step 25;
    fp8 with accumulation; ``save_model`` of the fp8 model."""
    out: dict[str, Any] = {}
    for strategy in ("ddp", "fsdp2"):
        result: dict[str, Any] = {}
        bf16 = Run(accelerator_for(strategy, "bf16"))
        result["bf16"] = bf16.train(STEPS)
        accelerator = accelerator_for(strategy, "fp8")
        run = Run(accelerator)
        result["backend"] = accelerator.fp8_backend.value
        result["kinds"] = layer_kinds(run.model)
        result["fp8"] = run.train(SAVE_AT)
        result["eval_before_save"] = run.evaluate()
        checkpoint = Path(folder, strategy, "state")
        accelerator.save_state(str(checkpoint))
        result["fp8"] += run.train(STEPS - SAVE_AT)
        weights = Path(folder, strategy, "weights")
        accelerator.save_model(run.model, str(weights), max_shard_size="40KB")
        result["saved_from"] = {
            name: tensor.float().sum().item()
            for name, tensor in accelerator.get_state_dict(run.model).items()
        }
        accumulate = Run(accelerator_for(strategy, "fp8", gradient_accumulation_steps=2), 2)
        result["fp8_accumulate"] = accumulate.train(10)
        out[strategy] = result
    return out


def resume_launch(folder: str) -> dict[str, Any]:
    """A fresh launch: per strategy, ``load_state`` into a new fp8 run and train 25 steps."""
    out: dict[str, Any] = {}
    for strategy in ("ddp", "fsdp2"):
        accelerator = accelerator_for(strategy, "fp8")
        run = Run(accelerator)
        accelerator.load_state(str(Path(folder, strategy, "state")))
        run.step = SAVE_AT
        out[strategy] = {"eval": run.evaluate(), "fp8": run.train(STEPS - SAVE_AT)}
    return out
