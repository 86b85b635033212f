"""Big-model inference: load_checkpoint_and_dispatch and a CPU-offloaded forward, accel vs baseline.

1. Load: a sharded safetensors checkpoint (``--size-mb``, default 2048, written once with
   ``save_model`` into ``--dir``) into an ``init_empty_weights`` model with
   ``load_checkpoint_and_dispatch(device_map={"": "cpu"})`` (and ``{"": 0}`` with a GPU). Baselines
   in the same run, alternated A B A B: Accelerate's ``load_checkpoint_and_dispatch`` on the same
   files when ``accelerate`` is importable, and always plain torch (``safetensors.torch.load_file``
   per shard + ``load_state_dict(assign=True)`` into a meta model). The files are in the page
   cache for every round (a warm-up round reads them first), so this measures the loaders.
2. Forward with ``cpu_offload``: a model of many small blocks (``--blocks``) whose weights live in
   CPU memory and are brought to the execution device (the CPU, or GPU 0 when there is one) by
   hooks for each call; against Accelerate's ``cpu_offload`` (else the plain model).

Medians of ``--repeats`` rounds; ratio = accel / baseline (target <= 1.0).

Run: ``python benchmarks/bench_big_model.py [--size-mb 2048] [--repeats 5] [--dir /tmp/bench_big_model]``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

import accel_ckpt
from accel_ckpt import init_empty_weights, load_checkpoint_and_dispatch, save_model

MB = 1024 * 1024
HAS_ACCELERATE = importlib.util.find_spec("accelerate") is not None


class Block(nn.Module):
    """A residual MLP block."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual MLP."""
        return x + self.fc2(torch.relu(self.fc1(self.ln(x))))


class Stack(nn.Module):
    """Blocks in a row."""

    def __init__(self, width: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, hidden) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Every block in turn."""
        for block in self.blocks:
            x = block(x)
        return x


WIDTH, HIDDEN = 2048, 8192
BLOCK_BYTES = 2 * WIDTH * HIDDEN * 4


def checkpoint(folder: Path, size_mb: int) -> tuple[Path, int]:
    """Write (once) a sharded checkpoint of about ``size_mb``; returns its folder and depth."""
    depth = max(1, round(size_mb * MB / BLOCK_BYTES))
    target = folder / f"stack-{depth}"
    if not (target / "model.safetensors.index.json").exists():
        torch.manual_seed(0)
        save_model(Stack(WIDTH, HIDDEN, depth), target, max_shard_size="500MB")
    return target, depth


def timed(function: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    result = function()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    del result
    gc.collect()
    return elapsed


def load_accel(path: Path, depth: int, device: int | str) -> nn.Module:
    with init_empty_weights():
        model = Stack(WIDTH, HIDDEN, depth)
    return load_checkpoint_and_dispatch(model, path, device_map={"": device})


def load_accelerate(path: Path, depth: int, device: int | str) -> nn.Module:
    import accelerate

    with accelerate.init_empty_weights():
        model = Stack(WIDTH, HIDDEN, depth)
    return accelerate.load_checkpoint_and_dispatch(model, str(path), device_map={"": device})


def load_torch(path: Path, depth: int, device: int | str) -> nn.Module:
    with torch.device("meta"):
        model = Stack(WIDTH, HIDDEN, depth)
    target = f"cuda:{device}" if isinstance(device, int) else device
    for shard in sorted(path.glob("*.safetensors")):
        model.load_state_dict(load_file(shard, device=target), strict=False, assign=True)
    return model


def compare(
    label: str, contenders: dict[str, Callable[[], object]], repeats: int
) -> dict[str, float]:
    """Alternate the contenders ``repeats`` times after a warm-up round; print medians."""
    for function in contenders.values():
        timed(function)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, function in contenders.items():
            times[name].append(timed(function))
    medians = {name: statistics.median(values) for name, values in times.items()}
    ours = medians["accel"]
    for name, value in medians.items():
        ratio = "" if name == "accel" else f"  ratio accel/{name} = {ours / value:.2f}"
        print(f"{label:<34} {name:<11} median {value * 1000:9.1f} ms{ratio}")
    return medians


def bench_load(folder: Path, size_mb: int, repeats: int) -> None:
    path, depth = checkpoint(folder, size_mb)
    total = sum(f.stat().st_size for f in path.glob("*.safetensors")) / MB
    print(f"checkpoint: {path} ({total:.0f} MB, {len(list(path.glob('*.safetensors')))} shards)")
    devices: list[int | str] = ["cpu"] + ([0] if torch.cuda.is_available() else [])
    for device in devices:
        contenders: dict[str, Callable[[], object]] = {
            "accel": lambda d=device: load_accel(path, depth, d)
        }
        if HAS_ACCELERATE:
            contenders["accelerate"] = lambda d=device: load_accelerate(path, depth, d)
        contenders["torch"] = lambda d=device: load_torch(path, depth, d)
        medians = compare(f"load {total:.0f} MB -> {device}", contenders, repeats)
        print(f"  accel throughput {total / medians['accel']:.0f} MB/s")
        # CPU loads may be lazy (memory-mapped): also time loading plus reading every weight.
        touched = {name: _touching(function) for name, function in contenders.items()}
        medians = compare(f"load+touch {total:.0f} MB -> {device}", touched, repeats)
        print(f"  accel throughput {total / medians['accel']:.0f} MB/s")


def _touching(load: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        model = load()
        assert isinstance(model, nn.Module)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.sum()
        return model

    return run


def bench_offload(blocks: int, repeats: int, calls: int) -> None:
    device: int | str = 0 if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    reference = Stack(512, 2048, blocks).eval()
    state = reference.state_dict()
    sample = torch.randn(8, 512)

    def offloaded(offload: Callable[..., nn.Module]) -> nn.Module:
        model = Stack(512, 2048, blocks).eval()
        model.load_state_dict(state)
        return offload(model, execution_device=device)

    models: dict[str, nn.Module] = {"accel": offloaded(accel_ckpt.cpu_offload)}
    if HAS_ACCELERATE:
        import accelerate

        models["accelerate"] = offloaded(accelerate.cpu_offload)
    else:
        models["plain"] = copy.deepcopy(reference).to(device)
    # Inputs on the execution device, as Accelerate's docs pass them (its root hook does not move
    # them, and the blocks' residual connections need them there).
    inputs = sample.to(device)
    with torch.no_grad():
        expected = reference(sample)
        for name, model in models.items():
            assert torch.allclose(model(inputs).cpu(), expected, atol=1e-4), name

    def run(model: nn.Module) -> Callable[[], object]:
        def call() -> object:
            with torch.no_grad():
                for _ in range(calls):
                    model(inputs)
            return None

        return call

    size = sum(t.numel() * t.element_size() for t in state.values()) / MB
    compare(
        f"cpu_offload fwd x{calls} ({blocks} blocks, {size:.0f} MB) on {device}",
        {name: run(model) for name, model in models.items()},
        repeats,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=48)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench_big_model"))
    parser.add_argument("--skip-load", action="store_true")
    args = parser.parse_args()
    versions = f"torch {torch.__version__}"
    if HAS_ACCELERATE:
        import accelerate

        versions += f", accelerate {accelerate.__version__}"
    print(f"{versions}; threads {torch.get_num_threads()}; cuda {torch.cuda.is_available()}")
    args.dir.mkdir(parents=True, exist_ok=True)
    if not args.skip_load:
        bench_load(args.dir, args.size_mb, args.repeats)
    bench_offload(args.blocks, args.repeats, args.calls)


if __name__ == "__main__":
    main()
