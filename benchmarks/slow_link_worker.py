"""One process of ``bench_slow_link.py``: the diloco example's language model, one way of syncing.

Modes (the same model, data and number of samples in each):

* ``raw``: hand-written DDP over the launcher's variables (the baseline);
* ``ddp``: the Accelerator, DDP across the machines (a gradient all-reduce per step);
* ``ft``: per-step replica groups (one per machine; the gradients cross the link every step);
* ``diloco``: replica groups inside ``LocalSGD(..., diloco=DiLoCoSettings(...))``: only the
  outer sync crosses the link, every ``--sync_every`` steps (``--fragments`` > 1: streaming).

The first process of each machine writes ``--out``/``<mode>-<machine>.json``: the wall-clock
time of every optimizer step and the final evaluation loss.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path
from types import ModuleType

import torch
from torch.utils.data import DataLoader

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "examples" / "by_feature" / "diloco.py"


def load_example() -> ModuleType:
    """The diloco example as a module (its dataset, model and loss)."""
    spec = importlib.util.spec_from_file_location("diloco_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse() -> argparse.Namespace:
    """The worker's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["raw", "ddp", "ft", "diloco"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=6400)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--sync_every", type=int, default=50)
    parser.add_argument("--fragments", type=int, default=1)
    parser.add_argument("--fragment_sync_delay", type=int, default=0)
    parser.add_argument("--quantize", action="store_true")
    parser.add_argument("--lr", type=float, default=2e-3)
    return parser.parse_args()


def write(out: Path, name: str, steps: list[float], loss: float) -> None:
    """This machine's record."""
    out.mkdir(parents=True, exist_ok=True)
    record = {"step_times": steps, "eval_loss": loss}
    (out / name).write_text(json.dumps(record))


def train_raw(example: ModuleType, args: argparse.Namespace) -> None:
    """Hand-written DDP: the baseline every other mode is compared with."""
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(0)
    data = example.MarkovText(args.samples, seed=1)
    sampler = torch.utils.data.DistributedSampler(data, world, rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = torch.nn.parallel.DistributedDataParallel(example.TinyLanguageModel(args.width))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps = []
    for tokens in loader:
        loss = example.next_token_loss(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps.append(time.time())
    evaluation = example.MarkovText(256, seed=2).tokens
    with torch.no_grad():
        final = example.next_token_loss(model.module, evaluation).item()
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        write(args.out, f"raw-{int(os.environ.get('GROUP_RANK', '0'))}.json", steps, final)
    torch.distributed.destroy_process_group()


def train_accel(example: ModuleType, args: argparse.Namespace) -> None:
    """The Accelerator in ``ddp``, ``ft`` or ``diloco`` mode."""
    from accel import Accelerator, DiLoCoSettings
    from accel.local_sgd import LocalSGD

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = example.TinyLanguageModel(args.width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    train = DataLoader(
        example.MarkovText(args.samples, seed=1), batch_size=args.batch_size, shuffle=True
    )
    model, optimizer, train = accelerator.prepare(model, optimizer, train)
    diloco = args.mode == "diloco"
    settings = DiLoCoSettings(
        fragments=args.fragments,
        fragment_sync_delay=args.fragment_sync_delay,
        quantize=args.quantize,
    )
    steps = []
    with LocalSGD(
        accelerator,
        model,
        local_sgd_steps=args.sync_every,
        enabled=diloco,
        diloco=settings if diloco else None,
    ) as local_sgd:
        for tokens in train:
            loss = example.next_token_loss(model, tokens)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
            steps.append(time.time())
    evaluation = example.MarkovText(256, seed=2).tokens.to(accelerator.device)
    model.eval()
    with torch.no_grad():
        final = example.next_token_loss(model, evaluation).item()
    if accelerator.is_local_main_process:
        machine = os.environ.get("ACCEL_FT_REPLICA_ID") or os.environ.get("GROUP_RANK", "0")
        write(args.out, f"{args.mode}-{machine}.json", steps, final)
    accelerator.end_training()


def main() -> None:
    """Train in the chosen mode."""
    args = parse()
    example = load_example()
    if args.mode == "raw":
        train_raw(example, args)
    else:
        train_accel(example, args)


if __name__ == "__main__":
    main()
