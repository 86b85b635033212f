import pytest
import torch

from accel_state import (
    DistributedType,
    EnvironmentConfigError,
    GradientState,
    PartialState,
    PartialStateResetError,
    StateConflictError,
    reset_state,
    snapshot,
)

pytestmark = pytest.mark.usefixtures("clean_state")


def test_single_process_defaults():
    state = PartialState(cpu=True)
    assert state.distributed_type is DistributedType.NO
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed
    assert state.backend is None
    assert state.device == torch.device("cpu")
    state.wait_for_everyone()  # a no-op, must not need a process group
    assert "Distributed environment: DistributedType.NO" in repr(state)


def test_instances_share_one_record_and_reset_clears_it():
    first = PartialState(cpu=True)
    second = PartialState()
    assert second.device == first.device
    assert snapshot()["PartialState"]["layout"].world_size == 1
    reset_state()
    assert not PartialState._shared_state
    assert PartialState(cpu=True).initialized


def test_reading_a_setting_after_a_reset_says_the_state_was_reset():
    # Regression: a PartialState kept across _reset_state() raised KeyError: 'layout'.
    state = PartialState(cpu=True)
    state._reset_state()
    with pytest.raises(AttributeError, match=r"PartialState._reset_state\(\)") as error:
        _ = state.num_processes
    assert isinstance(error.value, PartialStateResetError)
    with pytest.raises(PartialStateResetError):
        _ = state.device
    state.extra = "value"  # setting attributes still works, as in Accelerate
    assert state.extra == "value"
    with pytest.raises(AttributeError, match="has no attribute 'missing'") as plain:
        _ = PartialState(cpu=True).missing
    assert not isinstance(plain.value, PartialStateResetError)


def test_conflicting_request_after_initialisation(monkeypatch):
    PartialState(cpu=True)
    monkeypatch.setattr(PartialState, "device", property(lambda self: torch.device("cuda", 0)))
    with pytest.raises(StateConflictError, match="cpu=True cannot be honoured"):
        PartialState(cpu=True)


def test_contract_variables_drive_the_state(monkeypatch):
    monkeypatch.setenv("ACCEL_USE_CPU", "1")
    monkeypatch.setenv("ACCEL_USE_FSDP", "true")
    monkeypatch.setenv("ACCEL_DEBUG_MODE", "yes")
    state = PartialState()
    assert state.device.type == "cpu"
    assert state.distributed_type is DistributedType.FSDP
    assert state.debug


def test_decorators_in_a_single_process(capsys):
    state = PartialState(cpu=True)
    assert state.on_main_process(lambda: "main")() == "main"
    assert state.on_local_main_process(lambda: "local")() == "local"
    assert state.on_last_process(lambda: "last")() == "last"
    assert state.on_process(process_index=0)(lambda: "zero")() == "zero"
    assert state.on_process(process_index=1)(lambda: "one")() is None
    assert state.on_local_process(local_process_index=0)(lambda: "l0")() == "l0"
    with pytest.raises(ValueError, match="process_index=<rank>"):
        state.on_process(lambda: None)
    state.print("printed once")
    assert capsys.readouterr().out == "printed once\n"


def test_split_between_processes_single_process_returns_everything():
    state = PartialState(cpu=True)
    with state.split_between_processes([1, 2, 3]) as share:
        assert share == [1, 2, 3]
    with state.split_between_processes("abcde") as share:
        assert share == "abcde"
    with state.split_between_processes(b"xy") as share:
        assert share == b"xy"
    with pytest.raises(TypeError, match="not int; convert it"), state.split_between_processes(3):
        pass
    with state.main_process_first():
        pass


class RowTable:
    """Stands for a Hugging Face datasets.Dataset: rows picked with select(indices)."""

    def __init__(self, rows):
        self.column_names = ["k"]
        self.rows = list(rows)

    def __len__(self):
        return len(self.rows)

    def select(self, indices):
        return RowTable(self.rows[i] for i in indices)


@pytest.mark.parametrize(
    ("length", "padding", "shares"),
    [
        (4, False, [[0, 1], [2, 3]]),
        (3, False, [[0, 1], [2]]),
        (3, True, [[0, 1], [2, 2]]),  # the last row repeated, as for lists
        (1, True, [[0], [0]]),
    ],
)
def test_split_inputs_selects_rows_of_a_dataset(length, padding, shares):
    from accel_state.splitting import split_inputs

    table = RowTable(range(length))
    got = [split_inputs(table, 2, rank, apply_padding=padding) for rank in (0, 1)]
    assert all(isinstance(share, RowTable) for share in got)
    assert [share.rows for share in got] == shares


def test_gradient_state_is_shared_and_tracks_dataloaders():
    class Loader:
        pass

    gradient_state = GradientState({"num_steps": 4})
    assert GradientState().num_steps == 4
    assert gradient_state.sync_gradients and not gradient_state.in_dataloader
    loader = Loader()
    gradient_state.add_dataloader(loader)
    assert GradientState().active_dataloader is loader
    gradient_state.set_end_of_dataloader(True)
    gradient_state.set_remainder(3)
    assert (GradientState().end_of_dataloader, GradientState().remainder) == (True, 3)
    gradient_state.remove_dataloader(loader)
    assert not gradient_state.in_dataloader and not gradient_state.end_of_dataloader
    with pytest.raises(ValueError, match="Unknown gradient accumulation settings"):
        GradientState({"num_step": 2})
    reset_state()
    assert GradientState().num_steps == 1


@pytest.mark.xla
def test_xla_single_device_state(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    state = PartialState()
    assert state.device.type == "xla"
    assert state.distributed_type is DistributedType.XLA
    assert state.num_processes == 1 and state.is_main_process
    assert state.layout.source == "xla"
    state.wait_for_everyone()


def test_debug_is_settable_and_accelerates_variable_is_read(monkeypatch):
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "true")
    state = PartialState()
    assert state.debug is True
    state.debug = False
    assert PartialState().debug is False


def test_timeouts_default_to_ten_minutes_then_five_and_an_explicit_one_stays():
    import datetime

    from accel_state.process_group import resolve_timeout

    default = resolve_timeout(None, None)
    assert (default.startup, default.collective, default.explicit) == (
        datetime.timedelta(minutes=10),
        datetime.timedelta(minutes=5),
        False,
    )
    from_env = resolve_timeout(None, 12.5)
    assert from_env.startup == from_env.collective == datetime.timedelta(seconds=12.5)
    assert resolve_timeout(datetime.timedelta(hours=2), 12.5).collective.total_seconds() == 7200
    state = PartialState(timeout=42)
    assert state.timeout.total_seconds() == state.collective_timeout.total_seconds() == 42
    assert state.lower_timeouts() is False and state.timeout.total_seconds() == 42


def test_restart_count_is_read_from_torch_elastic(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert PartialState().restart_count == 3


def test_restart_count_adds_slurm_requeues(monkeypatch):
    # A job requeued by SLURM (after exiting 75) is a restart too; torch elastic's count adds.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert PartialState().restart_count == 1
    reset_state()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert PartialState().restart_count == 3


# What `srun -n2 bash -c 'python train.py'` gives task 1 (SLURM 22.05).
SRUN_BASH_TASK = {
    "SLURM_JOB_NAME": "bash",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_NODEID": "0",
    "SLURM_JOB_ID": "7",
}


def test_a_multi_task_srun_step_seen_as_one_process_is_an_error_naming_the_fix(monkeypatch):
    for name, value in SRUN_BASH_TASK.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(EnvironmentConfigError) as raised:
        PartialState(cpu=True)
    message = str(raised.value)
    for part in (
        "SLURM_STEP_NUM_TASKS=2",
        "SLURM_JOB_NAME='bash'",
        "--job-name",
        "srun --ntasks 1",
    ):
        assert part in message


@pytest.mark.parametrize(
    "change",
    [
        {
            "SLURM_STEP_NUM_TASKS": "1",
            "SLURM_NTASKS": "1",
            "SLURM_PROCID": "0",
        },  # srun -n1 --pty bash
        {"SLURM_PROCID": None},  # salloc -n2 and python in its shell: not a task of a step
        # srun -N2 accel launch --ft_replicas 2 --ft_replica_id $SLURM_NODEID: one replica
        # group of one process per task, each its own world (the groups meet through torchft).
        {"ACCEL_FT_REPLICA_ID": "1", "ACCEL_FT_REPLICAS": "2"},
    ],
)
def test_a_one_task_step_or_an_allocation_shell_stays_a_plain_process(monkeypatch, change):
    for name, value in {**SRUN_BASH_TASK, **change}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert PartialState(cpu=True).num_processes == 1


@pytest.mark.parametrize(
    ("source", "settings", "expected"),
    [
        ("torchelastic", {"use_fsdp": True}, True),
        ("torchelastic", {"use_deepspeed": True}, True),
        ("torchelastic", {}, False),  # a one-process plain job stays group-free
        ("local", {"use_fsdp": True}, False),  # `python script.py`: no rendezvous to join
    ],
)
def test_one_launched_sharding_process_gets_a_group_of_one(source, settings, expected):
    from accel_state.cluster import ProcessLayout
    from accel_state.contract import LaunchContract
    from accel_state.partial_state import _needs_process_group

    layout = ProcessLayout(world_size=1, source=source)
    assert _needs_process_group(layout, LaunchContract(**settings)) is expected
    assert _needs_process_group(ProcessLayout(world_size=2, source=source), LaunchContract())


def test_sagemaker_data_parallel_is_refused_by_name():
    """transformers passes ``_use_sagemaker_dp=True`` inside SageMaker; accel says it cannot."""
    with pytest.raises(EnvironmentConfigError, match="_use_sagemaker_dp=True"):
        PartialState(_use_sagemaker_dp=True)
    assert PartialState(_use_sagemaker_dp=False).num_processes == 1
