"""LocalSGD(diloco=DiLoCoSettings(...)): settings and refusals without replica groups.

DiLoCo across real replica groups (torchft, ``accel launch --ft_replicas``) is tested end to
end in tests-integration/ft/test_diloco.py.
"""

import pytest
import torch

import accel
import accel.utils
from accel import Accelerator
from accel.diloco import DiLoCoSettings, split_into_fragments
from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel.local_sgd import LocalSGD


def test_exported_from_accel_and_accel_utils():
    assert accel.DiLoCoSettings is DiLoCoSettings
    assert accel.utils.DiLoCoSettings is DiLoCoSettings


def test_defaults_are_diloco_papers_outer_nesterov_sgd():
    settings = DiLoCoSettings()
    parameters = [torch.nn.Parameter(torch.zeros(2))]
    outer = settings.build_outer_optimizer(parameters)
    assert isinstance(outer, torch.optim.SGD)
    group = outer.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"]) == (0.7, 0.9, True)
    assert settings.inner_steps_per_sync(8) == 8


def test_outer_optimizer_factory_overrides_the_sgd_fields():
    settings = DiLoCoSettings(outer_optimizer=lambda params: torch.optim.Adam(params, lr=0.1))
    outer = settings.build_outer_optimizer([torch.nn.Parameter(torch.zeros(2))])
    assert isinstance(outer, torch.optim.Adam)
    wrong = DiLoCoSettings(outer_optimizer=lambda params: "not an optimizer")
    with pytest.raises(
        AcceleratorConfigError, match=r"returned str, not a torch\.optim\.Optimizer"
    ):
        wrong.build_outer_optimizer([torch.nn.Parameter(torch.zeros(2))])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"outer_lr": 0}, r"outer_lr=0\): must be > 0"),
        ({"outer_lr": float("nan")}, r"outer_lr=nan\): must be a positive"),
        ({"outer_lr": "0.7"}, r"outer_lr='0.7'\)"),
        ({"outer_momentum": 1.0}, r"outer_momentum=1.0\): must be in \[0, 1\)"),
        ({"outer_momentum": -0.1}, r"outer_momentum=-0.1\)"),
        ({"nesterov": 1}, r"nesterov=1\): must be True or False"),
        ({"outer_momentum": 0.0}, r"nesterov=True\): needs outer_momentum > 0"),
        ({"outer_optimizer": "sgd"}, r"outer_optimizer='sgd'\): must be a callable"),
        ({"fragments": 0}, r"fragments=0\): must be a whole number >= 1"),
        ({"fragments": 2.0}, r"fragments=2.0\)"),
        ({"fragment_sync_delay": -1}, r"fragment_sync_delay=-1\): must be a whole number >= 0"),
        ({"fragment_update_alpha": 1.5}, r"fragment_update_alpha=1.5\): must be in \[0, 1\]"),
        ({"quantize": "yes"}, r"quantize='yes'\): must be True or False"),
    ],
)
def test_bad_fields_name_the_field_value_and_fix(fields, message):
    with pytest.raises(AcceleratorConfigError, match=message):
        DiLoCoSettings(**fields)


def test_momentum_free_sgd_is_accepted_without_nesterov():
    assert DiLoCoSettings(outer_momentum=0.0, nesterov=False).outer_momentum == 0.0


@pytest.mark.parametrize(
    ("fields", "steps", "message"),
    [
        ({"fragments": 3}, 8, r"local_sgd_steps=8\) with DiLoCoSettings\(fragments=3\).*multiple"),
        ({"fragments": 4}, 2, r"must be a multiple of fragments \(e.g. local_sgd_steps=4\)"),
        ({"fragments": 2, "fragment_sync_delay": 4}, 8, r"set fragment_sync_delay below 4"),
        ({"fragment_sync_delay": 1}, 1, r"fragment_sync_delay=1\).*below 1"),
    ],
)
def test_the_schedule_is_checked_against_local_sgd_steps(fields, steps, message):
    with pytest.raises(AcceleratorConfigError, match=message):
        DiLoCoSettings(**fields).inner_steps_per_sync(steps)


def test_streaming_needs_one_fragment_per_sync():
    assert DiLoCoSettings(fragments=2, fragment_sync_delay=3).inner_steps_per_sync(8) == 4


def test_fragments_take_whole_top_level_children_in_order():
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 2), torch.nn.Tanh(), torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    )
    first, second = split_into_fragments(model, 2)
    assert [id(p) for p in first.parameters()] == [id(p) for p in model[0].parameters()]
    assert [id(p) for p in second.parameters()] == [
        id(p) for part in (model[2], model[3]) for p in part.parameters()
    ]
    assert split_into_fragments(model, 1) == [model]
    with pytest.raises(AcceleratorConfigError, match=r"fragments=4\): the model has 3"):
        split_into_fragments(model, 4)


def test_without_replica_groups_diloco_names_the_launch_to_use():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    with pytest.raises(AcceleratorConfigError, match=r"accel launch --ft_replicas N"):
        LocalSGD(accelerator, model, local_sgd_steps=4, diloco=DiLoCoSettings())
    # Accelerate's LocalSGD is unchanged there, and diloco with enabled=False is a no-op.
    with LocalSGD(accelerator, model, local_sgd_steps=4) as local_sgd:
        local_sgd.step()
    disabled = LocalSGD(accelerator, model, 4, enabled=False, diloco=DiLoCoSettings())
    assert disabled.rounds is None and not disabled.enabled


def test_quantize_on_a_cpu_job_names_the_field_and_the_fix():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    with pytest.raises(
        UnsupportedFeatureError, match=r"quantize=True\) on a cpu job.*quantize=False"
    ):
        LocalSGD(accelerator, model, 4, diloco=DiLoCoSettings(quantize=True))


def test_diloco_must_be_settings():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    with pytest.raises(AcceleratorConfigError, match=r"pass accel.utils.DiLoCoSettings"):
        LocalSGD(accelerator, model, 4, diloco={"outer_lr": 0.7})


def test_one_replica_group_syncs_every_round_and_commits_each_sample_once(monkeypatch):
    """A real one-group job (an in-process lighthouse): rounds, the epoch's short last round."""
    pytest.importorskip("torchft")
    from torch.utils.data import DataLoader, TensorDataset

    from accel import FaultTolerancePlugin
    from accel_state.torchft_api import start_lighthouse

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    lighthouse = start_lighthouse("127.0.0.1", 0, min_replicas=1)
    accelerator = None
    try:
        plugin = FaultTolerancePlugin(replica_id=0, replicas=1, lighthouse=lighthouse.address)
        accelerator = Accelerator(cpu=True, fault_tolerance=plugin)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        data = TensorDataset(torch.randn(40, 4), torch.randn(40, 1), torch.arange(40))
        loader = DataLoader(data, batch_size=4, shuffle=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        settings = DiLoCoSettings(fragments=2, fragment_sync_delay=1)
        seen: list[int] = []
        with LocalSGD(accelerator, model, local_sgd_steps=8, diloco=settings) as local_sgd:
            for inputs, targets, index in loader:  # 10 batches: rounds of 4, 4, then 2
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()
                seen.extend(index.tolist())
            position = loader.position
            assert (position.epoch, position.committed, position.pending) == (1, 0, 0)
        rounds = local_sgd.rounds
        # The joining sync, three rounds, then the other fragment once as the block ends.
        assert (rounds.committed_syncs, rounds.failed_syncs) == (5, 0)
        assert accelerator.replica_training.manager.committed_steps == 5
        assert sorted(seen) == list(range(40))
        assert local_sgd.num_steps == 10
        assert accelerator.replica_training.rounds is None  # per-step commits again
    finally:
        if accelerator is not None and accelerator.replica_training is not None:
            accelerator.replica_training.manager.shutdown()
        lighthouse.shutdown()
