"""accel_state.torch_compat: version parsing, feature gates and the version-dependent helpers.

These run on every torch leg (2.4, 2.6, the pinned and the newest release): each helper must do
its job on the torch it finds, and a gate's answer must agree with that torch.
"""

import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

from accel_state.errors import AccelStateError, TorchFeatureError
from accel_state.testing.pytest_plugin import torch_feature_skip_reason
from accel_state.torch_compat import (
    GATES,
    OLDEST_SUPPORTED_TORCH,
    FeatureGate,
    gate_table,
    local_dcp_options,
    release_of,
    safe_globals,
    torch_at_least,
    torch_version,
    zip_record_checksums_off,
)


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("2.4.1+cu121", (2, 4, 1)),
        ("2.6.0a0+git1234", (2, 6, 0)),
        ("2.13.0", (2, 13, 0)),
        ("2.10", (2, 10)),
        ("v3.0.0rc1", (3, 0, 0)),
    ],
)
def test_release_of_reads_the_release_numbers(text, release):
    assert release_of(text) == release


def test_release_of_refuses_what_is_not_a_version():
    with pytest.raises(ValueError, match=r"version='nightly' is not a torch version"):
        release_of("nightly")


def test_comparisons_are_numeric_not_textual():
    assert torch_at_least("2.9", "2.10.0")  # textually "2.10" < "2.9"
    assert not torch_at_least("2.10", "2.9.1")
    assert torch_at_least("2.6", "2.6.0+cpu") and torch_at_least("2.6.0", "2.6")
    assert not torch_at_least("2.6", "2.5.99")
    assert torch_at_least(OLDEST_SUPPORTED_TORCH)  # this torch is a supported one
    assert torch_version() == torch.__version__.split("+")[0]


def test_every_gate_names_the_feature_the_versions_and_the_way_out():
    assert {"fsdp2", "device_mesh", "tensor_parallel", "replica_groups"} <= set(GATES)
    for key, gate in GATES.items():
        assert gate.key == key
        assert torch_at_least(OLDEST_SUPPORTED_TORCH, gate.minimum), key  # above the floor
        message = gate.message("2.4.1")
        assert message.startswith(f"{gate.feature} needs torch {gate.minimum} or newer")
        assert "this is torch 2.4.1" in message and gate.alternative in message
        assert gate.available(gate.minimum) and not gate.available("2.4.1")


def test_require_raises_the_callers_error_class_with_the_facts():
    class LaunchTorchError(TorchFeatureError):
        pass

    gate = GATES["fsdp2"]
    gate.require(found="2.6.0")  # new enough: nothing happens
    with pytest.raises(LaunchTorchError) as caught:
        gate.require(found="2.5.1", error=LaunchTorchError)
    error = caught.value
    assert isinstance(error, AccelStateError) and isinstance(error, RuntimeError)
    assert (error.feature, error.found, error.minimum) == (gate.feature, "2.5.1", "2.6")
    assert "FSDP1 (fsdp_version=1) works on this torch" in str(error)
    assert error.alternative == gate.alternative


def test_a_cpu_minimum_applies_to_cpu_jobs_only():
    gate = GATES["fsdp2"]
    assert gate.cpu_minimum is not None
    assert gate.available("2.6.0", device_type="cuda") and gate.available("2.6.0")
    assert not gate.available("2.6.0", device_type="cpu")
    message = gate.message("2.6.0", device_type="cpu")
    assert f"needs torch {gate.cpu_minimum} or newer on the CPU (gloo)" in message
    assert gate.cpu_reason in message and gate.alternative in message
    with pytest.raises(TorchFeatureError) as caught:
        gate.require(found="2.6.0", device_type="cpu")
    assert caught.value.minimum == gate.cpu_minimum


def test_the_running_torch_agrees_with_every_gate():
    for gate in GATES.values():
        assert gate.available() == torch_at_least(gate.minimum)
        if gate.available():
            gate.require()
        else:
            with pytest.raises(TorchFeatureError, match=f"this is torch {torch_version()}"):
                gate.require()


def test_a_gate_key_is_unique_and_a_marker_typo_is_an_error():
    gate = FeatureGate(key="x", feature="X", minimum="2.5", reason="r", alternative="a")
    with pytest.raises(ValueError, match="two feature gates are named 'x'"):
        gate_table([gate, gate])
    with pytest.raises(KeyError, match="torch_feature\\('fsdp3'\\): no such gate"):
        torch_feature_skip_reason("fsdp3")
    fsdp2 = GATES["fsdp2"]  # the marker asks as a CPU test leg does
    expected = None if fsdp2.available(device_type="cpu") else fsdp2.message(device_type="cpu")
    assert torch_feature_skip_reason("fsdp2") == expected


def test_safe_globals_allows_a_class_inside_and_restores_the_list_after(tmp_path):
    path = tmp_path / "point.pt"
    torch.save({"point": pickle_probe()}, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    with safe_globals([Point]):
        assert torch.load(path, weights_only=True)["point"].coordinates == (1, 2)
    with pytest.raises(pickle.UnpicklingError):  # not left on the allow-list
        torch.load(path, weights_only=True)


class Point:
    """A class ``weights_only`` loading refuses unless allowed."""

    def __init__(self) -> None:
        self.coordinates = (1, 2)


def pickle_probe() -> Point:
    return Point()


def test_zip_record_checksums_off_writes_loadable_files_and_restores_the_setting(tmp_path):
    serialization = torch.serialization
    before = (
        serialization.get_crc32_options() if hasattr(serialization, "get_crc32_options") else None
    )
    with zip_record_checksums_off():
        torch.save({"a": torch.arange(5)}, tmp_path / "a.pt")
        if before is not None:
            assert serialization.get_crc32_options() is False
    after = serialization.get_crc32_options() if before is not None else None
    assert after == before
    assert torch.equal(torch.load(tmp_path / "a.pt", weights_only=True)["a"], torch.arange(5))


def test_local_dcp_options_save_and_load_without_a_process_group(tmp_path):
    pytest.importorskip("numpy", reason="torch.distributed.checkpoint's metadata needs numpy")
    from torch.distributed.checkpoint import load, save

    save({"w": torch.arange(6.0)}, checkpoint_id=tmp_path, **local_dcp_options())
    restored = {"w": torch.zeros(6)}
    load(restored, checkpoint_id=tmp_path, **local_dcp_options())
    assert torch.equal(restored["w"], torch.arange(6.0))


def test_is_dtensor_does_not_load_dtensor_for_plain_values():
    code = textwrap.dedent(
        """
        import sys, torch
        from accel_state.torch_compat import is_dtensor
        assert not is_dtensor(torch.ones(2)) and not is_dtensor("text")
        loaded = [m for m in sys.modules if m.startswith("torch.distributed._tensor")
                  or m == "torch.distributed.tensor._api"]
        print(loaded)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.torch_feature("device_mesh")
def test_is_dtensor_recognises_a_dtensor():
    code = textwrap.dedent(
        """
        import torch, torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, distribute_tensor
        from accel_state.torch_compat import is_dtensor
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        tensor = distribute_tensor(torch.ones(2), init_device_mesh("cpu", (1,)), [Replicate()])
        print(is_dtensor(tensor), is_dtensor(torch.ones(2)))
        dist.destroy_process_group()
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.split() == ["True", "False"], result.stderr
