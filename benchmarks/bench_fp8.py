"""fp8 (torchao) vs bf16 training step: time and memory, through the Accelerator and by hand.

Four variants train the same MLP stack in one process, alternating A B C D per round:
raw bf16 (``torch.autocast`` by hand), accel bf16 (``mixed_precision="bf16"``), raw fp8
(``torchao.float8.convert_to_float8_training`` + autocast by hand) and accel fp8
(``mixed_precision="fp8"``). We report the median step time of each, fp8 / bf16 and accel / raw
ratios, and memory: on the CPU the bytes autograd saves for backward in one step (fp8 layers keep
their inputs in float8), on a GPU ``torch.cuda.max_memory_allocated`` per step.

CPU (default): small matmuls, since torch's CPU ``_scaled_mm`` is a reference kernel; fp8 is
expected to be much *slower* there (it is for testing fp8 numerics, not for speed).
GPU (``--device cuda``): large matmuls (``--dim 8192``), compiled (torchao's fp8 speedups need
``torch.compile``), where fp8 should beat bf16 on an H100.

Run: ``python benchmarks/bench_fp8.py [--rounds 5] [--steps 5]`` or
``python benchmarks/bench_fp8.py --device cuda --dim 8192 --tokens 8192 --layers 4 --compile``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from accel import Accelerator
from accel_state import reset_state


def make_model(dim: int, layers: int, device: torch.device) -> torch.nn.Module:
    """An input layer, ``layers`` hidden square layers, an output layer (the two ends stay bf16)."""
    torch.manual_seed(0)
    blocks: list[torch.nn.Module] = [torch.nn.Linear(dim, dim)]
    for _ in range(layers):
        blocks += [torch.nn.GELU(), torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)]
    blocks += [torch.nn.GELU(), torch.nn.Linear(dim, dim)]
    return torch.nn.Sequential(*blocks).to(device)


def saved_bytes(step: Callable[[], None]) -> int:
    """Bytes of the tensors autograd saves for backward during one ``step``."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    return total


class Variant:
    """One way of training: builds its model and optimizer, runs timed steps."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.args = args
        self.device = torch.device(args.device)
        self.times: list[float] = []
        self.memory = 0
        self.step = self._build()
        self.step()  # warm-up (and compilation)
        self.memory = self._memory()

    def _build(self) -> Callable[[], None]:
        args, device = self.args, self.device
        model = make_model(args.dim, args.layers, device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        precision, by_hand = self.name.split()[1], self.name.startswith("raw")
        inputs = torch.randn(args.tokens, args.dim, device=device)
        if by_hand:
            if precision == "fp8":
                from torchao.float8 import convert_to_float8_training

                last = len(model) - 1
                convert_to_float8_training(
                    model, module_filter_fn=lambda _m, fqn: fqn not in ("0", str(last))
                )
            if args.compile:
                model = torch.compile(model)  # type: ignore[assignment]

            def step() -> None:
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = model(inputs).float().pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()

            return step
        reset_state()
        accelerator = Accelerator(
            mixed_precision=precision,
            cpu=device.type == "cpu",
            dynamo_backend="inductor" if args.compile else None,
        )
        prepared, optimizer = accelerator.prepare(model, optimizer)

        def accel_step() -> None:
            loss = prepared(inputs).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

        return accel_step

    def _memory(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            self.step()
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - before
        return saved_bytes(self.step)

    def run(self, steps: int) -> None:
        """Time ``steps`` steps; record the time per step."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.times.append((time.perf_counter() - start) / steps)

    @property
    def median(self) -> float:
        """Median seconds per step over the rounds."""
        return statistics.median(self.times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    names = ["raw bf16", "accel bf16", "raw fp8", "accel fp8"]
    variants = [Variant(name, args) for name in names]
    for _ in range(args.rounds):
        for variant in variants:  # A B C D, A B C D...
            variant.run(args.steps)
    by_name: dict[str, Any] = {v.name: v for v in variants}
    memory = "saved-for-backward MB" if args.device == "cpu" else "peak allocated MB"
    print(
        f"Device {args.device}, {args.layers} blocks of {args.dim}x{4 * args.dim} layers, "
        f"{args.tokens} tokens per step, compile={args.compile}; medians of {args.rounds} rounds "
        f"of {args.steps} steps, variants alternating.\n"
    )
    print(f"| variant | step ms | {memory} |\n| --- | --- | --- |")
    for variant in variants:
        print(f"| {variant.name} | {variant.median * 1e3:.2f} | {variant.memory / 2**20:.2f} |")
    print("\n| ratio | time | memory |\n| --- | --- | --- |")
    for label, a, b in (
        ("accel fp8 / accel bf16", "accel fp8", "accel bf16"),
        ("raw fp8 / raw bf16", "raw fp8", "raw bf16"),
        ("accel bf16 / raw bf16", "accel bf16", "raw bf16"),
        ("accel fp8 / raw fp8", "accel fp8", "raw fp8"),
    ):
        time_ratio = by_name[a].median / by_name[b].median
        memory_ratio = by_name[a].memory / max(1, by_name[b].memory)
        print(f"| {label} | {time_ratio:.2f} | {memory_ratio:.2f} |")


if __name__ == "__main__":
    main()
