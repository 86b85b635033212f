"""The seed quick tour's snippets, as written there with ``accelerate`` changed to ``accel``.

Each section prints ``OK <name>`` on the main process once its checks pass; any failure raises.
Run with ``accel launch --cpu --num_processes 2 quick_tour.py OUTPUT_DIR``.
"""

import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from accel import Accelerator, DistributedType
from accel.utils import load_checkpoint_in_model

output_dir = sys.argv[1]
torch.manual_seed(0)
features = torch.randn(64, 6)
labels = (features.sum(dim=1) > 0).long()
dataset = TensorDataset(features, labels)
validation = TensorDataset(torch.randn(37, 6), torch.randint(0, 2, (37,)))


def ok(name):
    if accelerator.is_main_process:
        print(f"OK {name}", flush=True)


def loss_function(outputs, targets):
    return torch.nn.functional.cross_entropy(outputs, targets)


# --- Main use: the four changes ------------------------------------------------------------
accelerator = Accelerator()
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
training_dataloader = DataLoader(dataset, batch_size=4, shuffle=True)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)
model, optimizer, training_dataloader, scheduler = accelerator.prepare(
    model, optimizer, training_dataloader, scheduler
)
assert len(training_dataloader) == -(
    -64 // (4 * accelerator.num_processes)
)  # even_batches rounds up
for batch in training_dataloader:
    optimizer.zero_grad()
    inputs, targets = batch
    outputs = model(inputs)
    loss = loss_function(outputs, targets)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
ok("main use")

# --- Distributed evaluation ------------------------------------------------------------------
validation_dataloader = accelerator.prepare(DataLoader(validation, batch_size=5))
seen = 0
for inputs, targets in validation_dataloader:
    predictions = model(inputs)
    all_predictions, all_targets = accelerator.gather_for_metrics((predictions, targets))
    seen += len(all_targets)
assert seen == len(validation), (seen, len(validation))
ok("distributed evaluation")

# --- Execute a statement only on one process -------------------------------------------------
marker = os.path.join(output_dir, f"local_main_{accelerator.process_index}")
if accelerator.is_local_main_process:
    open(marker, "w").close()
progress_bar = tqdm(range(3), disable=not accelerator.is_local_main_process)
for _ in progress_bar:
    pass
if accelerator.is_main_process:
    open(os.path.join(output_dir, "main_only"), "w").close()
accelerator.print("printed once per machine")
accelerator.wait_for_everyone()
written = sorted(
    name for name in os.listdir(output_dir) if name.startswith(("local_main", "main_only"))
)
assert written == ["local_main_0", "main_only"], written
ok("run once")

# --- Defer execution -------------------------------------------------------------------------
accelerator.wait_for_everyone()
ok("wait for everyone")

# --- Saving/loading a model ------------------------------------------------------------------
save_directory = os.path.join(output_dir, "model")
accelerator.wait_for_everyone()
accelerator.save_model(model, save_directory)
accelerator.wait_for_everyone()
accelerator.save_model(model, save_directory, max_shard_size="1GB", safe_serialization=True)
bin_directory = os.path.join(output_dir, "model_bin")
accelerator.save_model(model, bin_directory, safe_serialization=False)
accelerator.wait_for_everyone()
unwrapped_model = accelerator.unwrap_model(model)
reference = {k: v.clone() for k, v in unwrapped_model.state_dict().items()}
with torch.no_grad():
    for parameter in unwrapped_model.parameters():
        parameter.zero_()
path_to_checkpoint = os.path.join(bin_directory, "pytorch_model.bin")
unwrapped_model.load_state_dict(torch.load(path_to_checkpoint))
assert all(torch.equal(reference[k], v) for k, v in unwrapped_model.state_dict().items())
with torch.no_grad():
    for parameter in unwrapped_model.parameters():
        parameter.zero_()
device = accelerator.device
load_checkpoint_in_model(unwrapped_model, save_directory, device_map={"": device})
assert all(torch.equal(reference[k], v) for k, v in unwrapped_model.state_dict().items())
ok("save and load model")

# --- Saving/loading entire states ------------------------------------------------------------
state_directory = os.path.join(output_dir, "state")
accelerator.save_state(state_directory)
before = {k: v.clone() for k, v in unwrapped_model.state_dict().items()}
for batch in training_dataloader:
    inputs, targets = batch
    accelerator.backward(loss_function(model(inputs), targets))
    optimizer.step()
    optimizer.zero_grad()
accelerator.load_state(state_directory)
assert all(torch.equal(before[k], v) for k, v in unwrapped_model.state_dict().items())
ok("save and load state")

# --- Gradient clipping -----------------------------------------------------------------------
inputs, targets = next(iter(training_dataloader))
accelerator.backward(loss_function(model(inputs), targets) * 1000)
norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
total = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
assert norm > 1.0 and abs(total.item() - 1.0) < 1e-3, (norm, total)
accelerator.clip_grad_value_(model.parameters(), 0.01)
assert max(p.grad.abs().max().item() for p in model.parameters()) <= 0.01
optimizer.zero_grad()
ok("gradient clipping")

# --- Mixed precision -------------------------------------------------------------------------
outputs = model(inputs)
with accelerator.autocast():
    loss = loss_function(outputs, targets)
accelerator.backward(loss)
optimizer.step()
lr_scheduler = scheduler
if not accelerator.optimizer_step_was_skipped:
    lr_scheduler.step()
optimizer.zero_grad()
ok("mixed precision")

# --- Gradient accumulation -------------------------------------------------------------------
accelerator = Accelerator(gradient_accumulation_steps=2)
model = torch.nn.Linear(6, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
training_dataloader = DataLoader(dataset, batch_size=4)
model, optimizer, training_dataloader = accelerator.prepare(model, optimizer, training_dataloader)
steps = 0
for input, label in training_dataloader:
    with accelerator.accumulate(model):
        predictions = model(input)
        loss = loss_function(predictions, label)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        steps += int(accelerator.sync_gradients)
assert steps == len(training_dataloader) // 2, (steps, len(training_dataloader))
ok("gradient accumulation")

# --- split_batches -----------------------------------------------------------------------------
accelerator = Accelerator(split_batches=True)
loader = accelerator.prepare(DataLoader(dataset, batch_size=12))
first = next(iter(loader))[0]
assert first.shape[0] == 12 // accelerator.num_processes
assert len(loader) == -(-64 // 12)  # the batch count does not change with the process count
ok("split batches")

# --- Training on TPU: branching on the distributed type ---------------------------------------
if accelerator.distributed_type == DistributedType.TPU:
    raise AssertionError("not on a TPU here")
else:
    assert accelerator.distributed_type in (DistributedType.MULTI_CPU, DistributedType.NO)
ok("distributed type")
accelerator.end_training()
