"""Launched by test_launch_surface.py: the launch flags as an Accelerator sees them.

Trains two steps, evaluates under no_grad, and (on rank 0) writes what it found to ``--out``.
"""

import argparse
import json
import os

import torch

from accel import Accelerator
from accel.utils import has_compiled_regions

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
out_path = parser.parse_args().out

accelerator = Accelerator()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


torch.manual_seed(0)
net = Net()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
net, optimizer = accelerator.prepare(net, optimizer)
losses = []
for _ in range(2):
    batch = torch.randn(8, 4, device=accelerator.device)
    loss = net(batch).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
with torch.no_grad():
    evaluated = accelerator.gather_for_metrics(net(torch.randn(2, 4, device=accelerator.device)))
inner = accelerator.unwrap_model(net, keep_torch_compile=True)
plugin = accelerator.state.dynamo_plugin
record = {
    "regional": plugin.use_regional_compilation,
    "backend": str(plugin.backend),
    "compiled_regions": has_compiled_regions(inner),
    "blocks_compiled": [
        getattr(block, "_compiled_call_impl", None) is not None
        for block in accelerator.unwrap_model(net).blocks
    ],
    "losses_finite": all(loss == loss for loss in losses),
    "eval_rows": evaluated.shape[0],
    "greeting": os.environ.get("GREETING"),
    "num_processes": accelerator.num_processes,
}
if accelerator.is_main_process:
    with open(out_path, "w") as handle:
        json.dump(record, handle)
accelerator.end_training()
