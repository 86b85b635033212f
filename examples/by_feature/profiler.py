"""Profile training steps with ``torch.profiler`` through ``accelerator.profile``.

``ProfileKwargs`` holds the profiler's settings (activities, schedule, shapes, memory, FLOPs and
an ``output_trace_dir`` where each process writes ``profile_<rank>.json``, a Chrome trace that
chrome://tracing or https://ui.perfetto.dev open). With a schedule, call ``prof.step()`` once per
training step. The script prints the table of the operators that took the longest.

    accel launch --cpu --num_processes 2 examples/by_feature/profiler.py --trace_dir runs/traces
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, ProfileKwargs
from accel.utils import set_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace_dir", default="runs/traces")
    args = parser.parse_args()
    set_seed(0)
    profile = ProfileKwargs(
        activities=["cpu"],
        schedule_option={"wait": 1, "warmup": 1, "active": 3, "repeat": 1},
        record_shapes=True,
        profile_memory=True,
        with_flops=True,
        output_trace_dir=args.trace_dir,
    )
    accelerator = Accelerator(kwargs_handlers=[profile])
    data = load_digits()
    dataset = TensorDataset(
        torch.tensor(data.data, dtype=torch.float32) / 16.0, torch.tensor(data.target)
    )
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(
        model, optimizer, DataLoader(dataset, batch_size=64, shuffle=True)
    )
    with accelerator.profile() as prof:
        for step, (features, labels) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
            if step == 6:  # wait 1 + warmup 1 + active 3 steps, then a little more
                break
    accelerator.print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    accelerator.print(f"traces written to {args.trace_dir}/profile_<rank>.json")
    accelerator.end_training()


if __name__ == "__main__":
    main()
