"""End-to-end checks of accel on however many processes run this program.

* **state**: every process has its own index, one of them is the main process, and the count
  matches the job's size;
* **RNG sync**: after :func:`~accel.utils.synchronize_rng_states`, processes seeded differently
  draw the same numbers (torch's global generator, and a given ``torch.Generator``);
* **dataloader sharding**: a prepared dataloader gives each process different samples whose union
  is the dataset (shuffled or not, ``split_batches`` or not), and
  :meth:`~accel.Accelerator.gather_for_metrics` drops the samples repeated to even out the last
  batch; :meth:`~accel.state.PartialState.split_between_processes` splits a list likewise;
* **training**: training on ``n`` processes with ``split_batches=True`` gives the same parameters
  as training one model on the full batches (DDP averages the shard gradients), on every process.

Run with ``debug_launcher(test_script.main)``, ``accel launch test_script.py`` or
``python test_script.py``.
"""

from __future__ import annotations

import copy
from typing import cast

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.state import AcceleratorState, GradientState, PartialState
from accel.test_utils.training import RegressionModel
from accel.utils import (
    DataLoaderConfiguration,
    gather,
    gather_object,
    set_seed,
    synchronize_rng_states,
)


def _reset() -> None:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


def _same_on_all(tensor: torch.Tensor, device: torch.device) -> bool:
    gathered = gather(tensor.to(device)[None]).cpu()
    return all(torch.equal(row, gathered[0]) for row in gathered)


def check_state(state: PartialState) -> None:
    """Distinct process indices ``0..n-1``, exactly one main process, the right local index."""
    indices = gather_object([state.process_index])
    if indices != list(range(state.num_processes)):
        raise AssertionError(f"process indices {indices}, expected 0..{state.num_processes - 1}")
    mains = gather_object([state.is_main_process])
    if mains.count(True) != 1 or not mains[0]:
        raise AssertionError(f"is_main_process per process: {mains}; expected only rank 0")
    if state.num_processes > 1 and not state.use_distributed:
        raise AssertionError(f"{state.num_processes} processes but use_distributed is False")
    if state.local_process_index != state.process_index % max(1, state.num_processes):
        raise AssertionError(
            f"local_process_index={state.local_process_index} on a one-machine job whose "
            f"process_index={state.process_index}"
        )


def check_rng_sync(state: PartialState) -> None:
    """Differently seeded processes draw the same numbers once their generators are synchronised."""
    torch.manual_seed(1000 + state.process_index)
    synchronize_rng_states(["torch"])
    draw = torch.rand(4)
    if not _same_on_all(draw, state.device):
        raise AssertionError(
            "synchronize_rng_states(['torch']) left the processes drawing differently"
        )
    generator = torch.Generator().manual_seed(2000 + state.process_index)
    synchronize_rng_states(["generator"], generator=generator)
    draw = torch.rand(4, generator=generator)
    if not _same_on_all(draw, state.device):
        raise AssertionError("synchronize_rng_states(['generator']) left the generators differing")


def _seen(accelerator: Accelerator, loader: DataLoader[tuple[torch.Tensor, ...]]) -> list[int]:
    """The sample ids this process gets from ``loader``."""
    return [int(v) for (batch,) in loader for v in batch.cpu().tolist()]


def check_dataloader_sharding(state: PartialState) -> None:
    """Each process gets different samples; together they are the whole dataset."""
    n = state.num_processes
    ids = torch.arange(8 * n)
    for shuffle in (False, True):
        for split_batches in (False, True):
            _reset()
            accelerator = Accelerator(
                dataloader_config=DataLoaderConfiguration(split_batches=split_batches)
            )
            set_seed(42)
            batch_size = 2 * n if split_batches else 2
            loader = accelerator.prepare(
                DataLoader(TensorDataset(ids), batch_size=batch_size, shuffle=shuffle)
            )
            mine = _seen(accelerator, loader)
            every = gather_object([mine])
            union = sorted(v for part in every for v in part)
            what = f"shuffle={shuffle}, split_batches={split_batches}"
            if union != ids.tolist():
                raise AssertionError(
                    f"{what}: the processes together saw {union}, not 0..{8 * n - 1}"
                )
            if len(mine) != 8:
                raise AssertionError(
                    f"{what}: process {state.process_index} saw {len(mine)} samples, not 8"
                )


def check_gather_for_metrics(state: PartialState) -> None:
    """With a dataset that does not split evenly, ``gather_for_metrics`` returns each sample once."""
    _reset()
    accelerator = Accelerator()
    n = state.num_processes
    length = 3 * n + 1
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(length)), batch_size=2))
    collected: list[int] = []
    for (batch,) in loader:
        collected += accelerator.gather_for_metrics(batch).cpu().tolist()
    if sorted(collected) != list(range(length)):
        raise AssertionError(
            f"gather_for_metrics over {length} samples on {n} processes gave {sorted(collected)}"
        )
    with state.split_between_processes(list(range(2 * n + 1))) as part:
        parts = gather_object([list(part)])
    union = sorted(v for p in parts for v in p)
    if union != list(range(2 * n + 1)):
        raise AssertionError(f"split_between_processes parts {parts} do not make 0..{2 * n}")


def check_training(state: PartialState) -> None:
    """``n`` processes with ``split_batches`` train exactly as one process on the full batches."""
    n = state.num_processes
    xs = torch.linspace(-1.0, 1.0, 16 * n)
    dataset = TensorDataset(xs, 2 * xs + 3)
    batch_size = 4 * n
    set_seed(0)
    reference = RegressionModel(a=0.1, b=-0.2)
    model = copy.deepcopy(reference)
    initial = copy.deepcopy(reference)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        loss = torch.nn.functional.mse_loss(reference(x), y)
        loss.backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()

    _reset()
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    trained = cast(RegressionModel, accelerator.unwrap_model(model))
    ours = torch.stack([trained.a.detach().cpu(), trained.b.detach().cpu()])
    expected = torch.stack([reference.a.detach(), reference.b.detach()])
    if not torch.allclose(ours, expected, atol=1e-5):
        raise AssertionError(
            f"after training on {n} processes (a, b) = {ours.tolist()}, but one process on the "
            f"full batches gives {expected.tolist()}"
        )
    if not _same_on_all(ours, state.device):
        raise AssertionError("the processes ended training with different parameters")
    with torch.no_grad():
        before = float(torch.nn.functional.mse_loss(initial(xs), 2 * xs + 3))
        after = float(torch.nn.functional.mse_loss(trained.cpu()(xs), 2 * xs + 3))
    if not after < before:
        raise AssertionError(f"training did not lower the loss: {before} before, {after} after")


def main() -> None:
    """Run every check on this process (collective ones on every process of the job)."""
    state = PartialState()
    for check in (
        check_state,
        check_rng_sync,
        check_dataloader_sharding,
        check_gather_for_metrics,
        check_training,
    ):
        state.print(f"test_script: {check.__name__}")
        check(state)
    _reset()
    state.wait_for_everyone()
    state.print("test_script: all checks passed")


if __name__ == "__main__":
    main()
