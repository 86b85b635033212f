"""FaultTolerancePlugin: settings from ``accel launch --ft_replicas``'s variables, and refusals.

Training across replica groups itself (torchft, real processes) is tested end to end in
tests-integration/ft.
"""

import pytest
import workers

from accel import Accelerator, DeepSpeedPlugin, FaultTolerancePlugin
from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel_state.testing import spawn_workers


def test_no_launcher_variables_means_no_replica_groups():
    assert FaultTolerancePlugin.from_env() is None
    assert Accelerator().replica_training is None


def test_the_launchers_variables_fill_the_plugin(monkeypatch):
    monkeypatch.setenv("ACCEL_FT_REPLICAS", "3")
    monkeypatch.setenv("ACCEL_FT_REPLICA_ID", "2")
    monkeypatch.setenv("ACCEL_FT_MIN_REPLICAS", "2")
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://10.0.0.1:29510")
    plugin = FaultTolerancePlugin.from_env()
    assert plugin == FaultTolerancePlugin(
        replica_id=2, replicas=3, min_replicas=2, lighthouse="http://10.0.0.1:29510"
    )
    # Fields given in code win over the variables.
    assert FaultTolerancePlugin(min_replicas=1).resolved().min_replicas == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"replicas": 2, "lighthouse": "http://h:1"}, "is incomplete"),
        ({"replica_id": 2, "replicas": 2, "lighthouse": "http://h:1"}, "outside 0..1"),
        ({"replica_id": 0, "replicas": 2, "min_replicas": 3, "lighthouse": "x"}, "between 1"),
        ({"replica_id": 0, "replicas": 1, "lighthouse": "x", "timeout": 0}, "timeout=0"),
    ],
)
def test_bad_settings_name_the_field_and_the_fix(fields, message):
    with pytest.raises(AcceleratorConfigError, match=message):
        FaultTolerancePlugin(**fields).resolved()


def test_a_variable_that_is_not_a_number_is_named(monkeypatch):
    monkeypatch.setenv("ACCEL_FT_REPLICAS", "two")
    with pytest.raises(AcceleratorConfigError, match="ACCEL_FT_REPLICAS='two'"):
        FaultTolerancePlugin.from_env()


def test_deepspeed_with_replica_groups_is_refused():
    plugin = FaultTolerancePlugin(replica_id=0, replicas=1, lighthouse="http://127.0.0.1:1")
    with pytest.raises(UnsupportedFeatureError, match="DeepSpeed's engine owns"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2), fault_tolerance=plugin)


def test_replication_inside_a_group_is_refused():
    (message, _) = spawn_workers(workers.replica_groups_refuse_dp_replicate, 2, timeout=180)
    assert "dp_replicate_size=2" in message and "--ft_replicas" in message
