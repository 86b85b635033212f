"""Restart count, the SIGTERM flag behind should_stop, latest_checkpoint, and timeout lowering."""

import os
import signal

import torch
import workers

from accel import Accelerator, fault_tolerance
from accel.utils import ProjectConfiguration
from accel_state.testing import spawn_workers


def test_restart_count_comes_from_torch_elastic(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert Accelerator().restart_count == 2


def test_restart_count_adds_slurm_requeues(monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert Accelerator().restart_count == 1


def test_should_stop_turns_true_after_sigterm_and_a_later_sigterm_goes_to_the_old_handler():
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        accelerator = Accelerator()
        assert accelerator.should_stop is False  # installs the handler
        os.kill(os.getpid(), signal.SIGTERM)
        assert accelerator.should_stop is True
        assert accelerator.should_stop is True  # stays true: the loop is being left
        assert seen == []
        # The launcher's forwarded copy of the scheduler's SIGTERM, milliseconds later: the
        # same request, not "stop at once".
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == []
        # A second request a clear interval later: what was there before.
        accelerator.fault_tolerance._first_sigterm_at -= fault_tolerance.REPEATED_SIGTERM_SECONDS
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        accelerator.fault_tolerance.uninstall()
        signal.signal(signal.SIGTERM, previous)


def test_latest_checkpoint_is_none_until_a_save_completes(tmp_path):
    config = ProjectConfiguration(tmp_path, automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_config=config)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    assert accelerator.latest_checkpoint() is None
    (tmp_path / "checkpoints" / ".checkpoint_0.accel-tmp-dead").mkdir(parents=True)  # a crash
    assert accelerator.latest_checkpoint() is None
    accelerator.save_state()
    accelerator.save_state()
    assert accelerator.latest_checkpoint() == tmp_path / "checkpoints" / "checkpoint_1"
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state()
    assert accelerator.unwrap_model(model).weight.abs().sum() > 0


def test_the_default_timeout_drops_after_the_first_step_on_every_group():
    # 10 minutes while the first step may compile, 5 minutes from then on (the checkpoint
    # group included); an explicit timeout is never changed (accel-state's tests).
    results = spawn_workers(workers.timeouts_around_the_first_step, 2, args=(False,), timeout=180)
    for result in results:
        assert result["before"] == (600.0, 600.0)
        assert result["after"] == (300.0, 300.0) and result["state"] == 300.0
