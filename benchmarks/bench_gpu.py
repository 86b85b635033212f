"""Training steps and checkpoints on one GPU: raw PyTorch vs accel (vs Accelerate when installed).

A 12-layer, 1024-wide GPT-style model, batch 8 x 1024 tokens, AdamW. Variants: bf16, fp16 (with
loss scaling), bf16 with 4 gradient-accumulation steps, bf16 under ``torch.compile`` (inductor).
Every measurement runs in a fresh process; the tools alternate (raw, accel, Accelerate, raw, ...)
and we report the median time per optimizer step and its ratio to raw. Then ``save_state`` /
``load_state`` of the model and AdamW state from the GPU against ``torch.save`` / ``torch.load``
(+ fsync) of the same state dicts.

Skips, saying why, without a CUDA GPU. Run: ``python benchmarks/bench_gpu.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

LAYERS, WIDTH, HEADS, VOCAB, BATCH, TOKENS = 12, 1024, 16, 8192, 8, 1024
VARIANTS = {
    "bf16": {"precision": "bf16", "accumulation": 1, "compile": False},
    "fp16": {"precision": "fp16", "accumulation": 1, "compile": False},
    "bf16 + accumulation 4": {"precision": "bf16", "accumulation": 4, "compile": False},
    "bf16 + torch.compile": {"precision": "bf16", "accumulation": 1, "compile": True},
}


class GPT(torch.nn.Module):
    """Token embedding, pre-norm causal transformer blocks, tied LM head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.position = torch.nn.Parameter(torch.zeros(TOKENS, WIDTH))
        layer = torch.nn.TransformerEncoderLayer(
            WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(WIDTH)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(TOKENS)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits for ``tokens`` (batch, time)."""
        hidden = self.embed(tokens) + self.position[: tokens.shape[1]]
        hidden = self.blocks(hidden, mask=self.mask, is_causal=True)
        return self.norm(hidden) @ self.embed.weight.T


def batches(count: int, device: str = "cuda") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    data = torch.randint(0, VOCAB, (4, BATCH, TOKENS + 1), generator=generator).to(device)
    for index in range(count):
        sample = data[index % 4]
        yield sample[:, :-1], sample[:, 1:]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def build_on_gpu() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """What a hand-written loop does: the same model moved to the GPU, then its optimizer."""
    torch.manual_seed(0)
    model = GPT().cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def raw_steps(settings: dict[str, Any], steps: int) -> Callable[[], None]:
    """One optimizer step of the hand-written loop per call."""
    model, optimizer = build_on_gpu()
    forward = torch.compile(model) if settings["compile"] else model
    dtype = torch.float16 if settings["precision"] == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda") if dtype is torch.float16 else None
    accumulation = settings["accumulation"]
    data = batches(steps * accumulation)

    def step() -> None:
        for _ in range(accumulation):
            inputs, targets = next(data)
            with torch.autocast("cuda", dtype=dtype):
                loss = lm_loss(forward(inputs), targets) / accumulation
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad()

    return step


def library_steps(library: str, settings: dict[str, Any], steps: int) -> Callable[[], None]:
    """One optimizer step of the Accelerator loop (accel's or Accelerate's) per call."""
    module = __import__(library)
    accumulation = settings["accumulation"]
    kwargs: dict[str, Any] = {
        "mixed_precision": settings["precision"],
        "gradient_accumulation_steps": accumulation,
    }
    if settings["compile"]:
        kwargs["dynamo_backend"] = "inductor"
    accelerator = module.Accelerator(**kwargs)
    model, optimizer = accelerator.prepare(*build())
    data = batches(steps * accumulation)

    def step() -> None:
        for _ in range(accumulation):
            inputs, targets = next(data)
            with accelerator.accumulate(model):
                loss = lm_loss(model(inputs), targets)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()

    return step


def time_steps(tool: str, variant: str, steps: int) -> float:
    """Milliseconds per optimizer step, after warm-up."""
    settings = VARIANTS[variant]
    warmup = 10 if settings["compile"] else 3
    make = raw_steps if tool == "raw" else lambda s, n: library_steps(tool, s, n)
    step = make(settings, steps + warmup)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps * 1000


def drop_page_cache() -> bool:
    """Empty the OS page cache so loads read from disk (needs root); whether it worked."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
    except OSError:
        return False
    return True


def time_checkpoint(tool: str) -> dict[str, float]:
    """Seconds to save, then (cold when possible) to load, model + AdamW state from the GPU."""
    folder = tempfile.mkdtemp(prefix=f"bench_gpu_{tool}_")
    try:
        if tool == "raw":
            model, optimizer = build_on_gpu()
        else:
            accelerator = __import__(tool).Accelerator(mixed_precision="bf16")
            model, optimizer = accelerator.prepare(*build())
        inputs, targets = next(batches(1))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lm_loss(model(inputs), targets).backward()
        optimizer.step()
        torch.cuda.synchronize()
        path = os.path.join(folder, "state.pt")
        started = time.perf_counter()
        if tool == "raw":
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        else:
            accelerator.save_state(os.path.join(folder, "ckpt"))
        saved = time.perf_counter() - started
        cold = drop_page_cache()
        started = time.perf_counter()
        if tool == "raw":
            state = torch.load(path, map_location="cuda", weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        else:
            accelerator.load_state(os.path.join(folder, "ckpt"))
        torch.cuda.synchronize()
        return {"save": saved, "load": time.perf_counter() - started, "cold": float(cold)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def in_fresh_process(*args: str) -> Any:
    """Run this file as a worker with ``args``; return the JSON it prints last."""
    output = subprocess.run(
        [sys.executable, __file__, "--worker", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def worker(args: list[str]) -> None:
    tool, what, steps = args[0], args[1], int(args[2])
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the JSON result
        result = time_checkpoint(tool) if what == "checkpoint" else time_steps(tool, what, steps)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--worker", nargs=3, metavar=("TOOL", "WHAT", "STEPS"))
    parser.add_argument(
        "--part",
        choices=["all", "steps", "checkpoint"],
        default="all",
        help="Only the training steps, or only save_state/load_state (each takes minutes).",
    )
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if not torch.cuda.is_available():
        print("Skipped: no CUDA GPU visible to this torch; run it on a GPU machine.")
        return
    tools = ["raw", "accel"] + (["accelerate"] if importlib.util.find_spec("accelerate") else [])
    names = {"raw": "raw PyTorch", "accel": "accel", "accelerate": "Accelerate"}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.rounds} rounds\n")
    if args.part in ("all", "steps"):
        _steps_table(tools, names, args.rounds, args.steps)
    if args.part in ("all", "checkpoint"):
        _checkpoint_table(tools, names, args.rounds)


def _steps_table(tools: list[str], names: dict[str, str], rounds: int, steps: int) -> None:
    header = " | ".join(f"{names[t]} ms" for t in tools)
    ratios = " | ".join(f"{names[t]} / raw" for t in tools[1:])
    print(f"| variant | {header} | {ratios} |")
    print("|" + " --- |" * (1 + 2 * len(tools) - 1))
    for variant in VARIANTS:
        times: dict[str, list[float]] = {tool: [] for tool in tools}
        for _ in range(rounds):
            for tool in tools:  # alternating: raw, accel, Accelerate, raw, ...
                times[tool].append(in_fresh_process(tool, variant, str(steps)))
        medians = {tool: statistics.median(values) for tool, values in times.items()}
        cells = " | ".join(f"{medians[t]:.1f}" for t in tools)
        quotients = " | ".join(f"{medians[t] / medians['raw']:.3f}" for t in tools[1:])
        print(f"| {variant} | {cells} | {quotients} |")


def _checkpoint_table(tools: list[str], names: dict[str, str], rounds: int) -> None:
    print(
        "\n| checkpoint (model + AdamW from the GPU) | "
        + " | ".join(names[t] for t in tools)
        + " |"
    )
    print("|" + " --- |" * (1 + len(tools)))
    results: dict[str, list[dict[str, float]]] = {tool: [] for tool in tools}
    for _ in range(rounds):
        for tool in tools:
            results[tool].append(in_fresh_process(tool, "checkpoint", "0"))
    cold = all(run["cold"] for runs in results.values() for run in runs)
    for phase in ("save", "load"):
        cells = " | ".join(
            f"{statistics.median(r[phase] for r in results[t]):.2f} s" for t in tools
        )
        label = phase if phase == "save" else f"load ({'cold' if cold else 'warm'} cache)"
        print(f"| {label} | {cells} |")


if __name__ == "__main__":
    main()
