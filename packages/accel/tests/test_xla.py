"""Training through the Accelerator on an XLA device (xla leg: torch_xla 2.9, PJRT_DEVICE=CPU).

The same loop runs on the host for reference. ``xla(min_devices=2)`` needs a TPU VM.
"""

import itertools

import pytest
import torch
import xla_workers

from accel import Accelerator
from accel_state import reset_state
from accel_state.testing import spawn_xla_workers

pytestmark = [pytest.mark.xla, pytest.mark.usefixtures("xla_state")]

MICRO_STEPS_PER_EPOCH = 7  # 7 micro-steps with accumulation 2: optimizer steps after 2, 4, 6 and 7


@pytest.fixture(scope="module")
def runs():
    """One training run on the XLA device and the same on the host."""
    on_xla = xla_workers.train()
    reset_state()
    on_host = xla_workers.train(cpu=True)
    return on_xla, on_host


def test_a_small_model_learns_on_the_xla_device(runs):
    on_xla, _ = runs
    assert on_xla["device"] == "xla" and on_xla["loader"] == "MpDeviceLoaderWrapper"
    assert on_xla["optimizer_steps_model"]  # the optimizer was pointed at the device parameters
    losses = on_xla["epoch_loss"]
    assert all(later < earlier for earlier, later in itertools.pairwise(losses))
    assert losses[-1] < losses[0] / 2


def test_accumulation_syncs_every_second_micro_step_and_at_the_end(runs):
    on_xla, on_host = runs
    epoch = [False, True, False, True, False, True, True]
    assert on_xla["sync"] == epoch * xla_workers.EPOCHS == on_host["sync"]


def test_clipping_bounds_the_global_norm_on_every_call(runs):
    on_xla, _ = runs
    assert len(on_xla["norms"]) == MICRO_STEPS_PER_EPOCH * xla_workers.EPOCHS
    clip = xla_workers.CLIP
    assert any(before > clip for before, _ in on_xla["norms"])  # clipping had work to do
    for before, after in on_xla["norms"]:
        assert after <= clip * (1 + 1e-4)
        assert after == pytest.approx(min(before, clip), rel=1e-3)


def test_the_graph_is_cut_after_each_optimizer_step(runs):
    on_xla, _ = runs
    steps = list(zip(on_xla["cuts_in_step"], on_xla["sync"], strict=True))
    cuts = [cut for cut, sync in steps if sync]
    skipped = [cut for cut, sync in steps if not sync]
    assert cuts and all(cut >= 1 for cut in cuts)
    assert skipped and all(cut == 0 for cut in skipped)  # no step, nothing to cut
    # Every step traces the same graphs: after the first epochs, nothing new is compiled.
    assert on_xla["compiles"][-1] == on_xla["compiles"][-2]


def test_xla_training_matches_the_host(runs):
    on_xla, on_host = runs
    for got, want in zip(on_xla["weights"], on_host["weights"], strict=True):
        assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-4)


def test_gather_for_metrics_returns_the_whole_evaluation_set(runs):
    on_xla, _ = runs
    assert on_xla["evaluated"] == list(range(10)) and on_xla["eval_device"] == "xla"
    assert on_xla["evaluated_objects"] == [f"s{i}" for i in range(10)]


def test_tied_weights_and_checkpoints_survive_prepare(tmp_path):
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Embedding(6, 4), torch.nn.Linear(4, 6, bias=False))
    model[1].weight = model[0].weight
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert model[1].weight is model[0].weight and model[0].weight.device.type == "xla"
    assert optimizer.param_groups[0]["params"] == [model[0].weight]
    tokens = torch.arange(6, device=accelerator.device)
    accelerator.backward(model(tokens).square().mean())
    optimizer.step()
    expected = model[0].weight.detach().cpu().clone()
    accelerator.save_state(tmp_path / "state")
    with torch.no_grad():
        model[0].weight.zero_()
    accelerator.load_state(tmp_path / "state")
    assert torch.equal(model[0].weight.detach().cpu(), expected)
    assert model[1].weight is model[0].weight


@pytest.mark.xla(min_devices=2)
def test_replicas_train_one_model():
    results = spawn_xla_workers(xla_workers.train, timeout=600)
    count = len(results)
    assert [r["process_index"] for r in results] == list(range(count))
    assert {r["num_processes"] for r in results} == {count}
    assert all(r["weights"] == results[0]["weights"] for r in results)  # replicas stay equal
    assert all(r["evaluated"] == list(range(10)) for r in results)
    assert results[0]["epoch_loss"][-1] < results[0]["epoch_loss"][0]
