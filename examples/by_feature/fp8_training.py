"""fp8 training with torchao through the Accelerator, on generated data (CPU or GPU).

Every ``nn.Linear`` but the first and last (and any whose dimensions are not multiples of 16)
becomes torchao's ``Float8Linear`` at ``prepare``; the rest runs in bf16 autocast. On the CPU
the fp8 matmuls use torch's reference kernel (slow, but the numerics are real); on an H100 use
bigger layers and ``--compile`` for speed.

    pip install 'accel[fp8]'
    python examples/by_feature/fp8_training.py
    accel launch --cpu --num_processes 2 --mixed_precision fp8 examples/by_feature/fp8_training.py
    accel launch --cpu --num_processes 2 --use_fsdp --mixed_precision fp8 \
        examples/by_feature/fp8_training.py      # FSDP2, weights all-gathered in float8
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from accel import Accelerator
from accel.utils import AORecipeKwargs, has_ao_layers

VOCAB, DIM, SEQ = 64, 32, 16


class Block(torch.nn.Module):
    """A residual MLP block."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, 4 * DIM)
        self.down = torch.nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TinyLM(torch.nn.Module):
    """Embedding, input layer, blocks, head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.inp = torch.nn.Linear(DIM, DIM)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # noqa: D102
        x = self.inp(self.embed(tokens))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batches(count: int, size: int, seed: int) -> list[torch.Tensor]:
    """Sequences following ``next = 5 * token + 3 (mod VOCAB)``: a rule the model can learn."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        tokens = [torch.randint(0, VOCAB, (size, 1), generator=generator)]
        for _ in range(SEQ):
            tokens.append((5 * tokens[-1] + 3) % VOCAB)
        out.append(torch.cat(tokens, dim=1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=8)
    args = parser.parse_args()

    # mixed_precision="fp8" unless the launcher chose it; AORecipeKwargs picks torchao.
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.utils.data.DataLoader(
        torch.cat(batches(args.steps, args.batch_size, seed=0)), batch_size=args.batch_size
    )
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    plain = accelerator.unwrap_model(model)
    accelerator.print(
        "fp8 layers:",
        [name for name, m in plain.named_modules() if type(m).__name__ == "Float8Linear"],
        "| has_ao_layers:",
        has_ao_layers(plain),
    )

    for step, tokens in enumerate(data):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
        )
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step % 5 == 0 or step == len(data) - 1:
            accelerator.print(
                f"step {step:3d}  loss {accelerator.reduce(loss.detach(), 'mean'):.3f}"
            )

    model.eval()
    with torch.no_grad():
        held_out = batches(1, 16, seed=1)[0].to(accelerator.device)
        logits = model(held_out[:, :-1])
        accuracy = (logits.argmax(-1) == held_out[:, 1:]).float().mean()
    accelerator.print(f"held-out next-token accuracy {accelerator.reduce(accuracy, 'mean'):.2f}")

    # The saved weights are plain tensors: they load into the unconverted model.
    folder = tempfile.mkdtemp() if accelerator.is_main_process else None
    folder = accelerator.gather_for_metrics([folder], use_gather_object=True)[0]
    accelerator.save_model(model, folder)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        from accel.utils import load_checkpoint_in_model

        fresh = TinyLM()
        load_checkpoint_in_model(fresh, folder, strict=True)
        print(f"saved to {folder}; loaded into a plain TinyLM: {type(fresh.blocks[0].up).__name__}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
