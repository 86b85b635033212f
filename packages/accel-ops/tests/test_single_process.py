"""Every operation without a process group (and with a 1-process group) behaves as one process."""

import gc
import weakref

import pytest
import torch
import torch.distributed as dist

import accel_ops
from accel_ops import (
    InvalidArgumentError,
    UnsupportedTypeError,
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_object,
    is_debug_mode,
    pad_across_processes,
    reduce,
    set_debug_mode,
)
from accel_state.testing import find_free_port


@pytest.fixture(autouse=True)
def _reset_debug_mode():
    set_debug_mode(None)
    yield
    set_debug_mode(None)


def nested():
    return {
        "a": torch.arange(3.0),
        "b": [torch.tensor(2.0), (torch.ones(2, 2, dtype=torch.int64),)],
    }


def check_single_process_semantics():
    data = nested()
    assert gather(data) is data
    assert broadcast(data) is data
    assert pad_across_processes(data, dim=0) is data
    assert copy_tensor_to_devices(data) is data
    objects = ["x", 1]
    assert gather_object(objects) is objects
    assert broadcast_object_list(objects) is objects
    summed = reduce({"a": torch.arange(3.0)}, "sum", scale=2.0)
    assert summed["a"].tolist() == [0.0, 2.0, 4.0]
    source = torch.ones(2)
    mean = reduce(source, "mean")
    assert torch.equal(mean, source) and mean is not source
    assert reduce(torch.tensor([3, 1]), "max").tolist() == [3, 1]
    assert reduce(torch.ones(1), "none", scale=3.0).item() == 3.0


def test_operations_without_process_group():
    assert not dist.is_initialized()
    check_single_process_semantics()


def test_operations_with_one_process_group():
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1
    )
    try:
        check_single_process_semantics()
    finally:
        dist.destroy_process_group()


def test_destroyed_group_is_freed_after_collectives():
    """accel-ops must not keep a destroyed group (and its gloo threads) alive until exit."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1
    )
    try:
        check_single_process_semantics()
        world = weakref.ref(dist.group.WORLD)
    finally:
        dist.destroy_process_group()
    gc.collect()
    assert world() is None


def test_argument_errors_name_argument_value_and_fix():
    with pytest.raises(InvalidArgumentError, match=r"reduction='avg'.*mean, sum, max, none"):
        reduce(torch.ones(1), "avg")
    with pytest.raises(
        InvalidArgumentError, match=r"needs floating-point.*int64.*tensor.float\(\)"
    ):
        reduce(torch.ones(2, dtype=torch.int64), "mean")
    with pytest.raises(InvalidArgumentError, match=r"scale=0\.5"):
        reduce(torch.ones(2, dtype=torch.int64), "sum", scale=0.5)
    with pytest.raises(
        InvalidArgumentError, match=r"from_process=1\) is not a process of this 1-process"
    ):
        broadcast(torch.ones(1), from_process=1)
    with pytest.raises(InvalidArgumentError, match="must be a process index"):
        broadcast_object_list([1], from_process="0")
    with pytest.raises(
        UnsupportedTypeError, match="tuple; it accepts a list, which it fills in place"
    ):
        broadcast_object_list((1, 2))
    with pytest.raises(InvalidArgumentError, match=r"dim='0'"):
        pad_across_processes(torch.ones(1), dim="0")
    with pytest.raises(UnsupportedTypeError, match=r"data\['labels'\]"):
        pad_across_processes({"labels": ["a"]})
    with pytest.raises(UnsupportedTypeError, match=r"reduce got a builtins.int at data\[1\]"):
        reduce([torch.ones(1), 3])


def test_pad_nested_tensor_warns_and_returns_input():
    nt = torch.nested.nested_tensor([torch.ones(3), torch.ones(1)], layout=torch.jagged)
    with pytest.warns(accel_ops.CannotPadNestedTensorWarning):
        assert pad_across_processes(nt) is nt


def test_debug_mode_sources(monkeypatch):
    monkeypatch.delenv("ACCEL_DEBUG_MODE", raising=False)
    assert not is_debug_mode()
    monkeypatch.setenv("ACCEL_DEBUG_MODE", "1")
    assert not is_debug_mode()  # the environment is read once and cached...
    set_debug_mode(None)  # ...until the toggle goes back to the environment
    assert is_debug_mode()
    set_debug_mode(False)
    assert not is_debug_mode() and is_debug_mode(debug=True)
    set_debug_mode(True)
    assert is_debug_mode() and not is_debug_mode(debug=False)


def test_debug_mode_reads_env_through_launch_contract(monkeypatch):
    monkeypatch.setenv("ACCEL_DEBUG_MODE", "maybe")
    with pytest.raises(Exception, match="ACCEL_DEBUG_MODE"):
        is_debug_mode()


def test_xla_import_error_names_the_extra():
    pytest.importorskip("torch")
    try:
        import torch_xla  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch_xla is installed")
    from accel_ops import xla

    with pytest.raises(accel_ops.XLAUnavailableError, match=r"accel-ops\[xla\]"):
        xla.xla_model()


def test_public_api_is_complete():
    for name in accel_ops.__all__:
        assert hasattr(accel_ops, name), name


def test_import_loads_no_xla_and_no_state():
    import subprocess
    import sys

    code = (
        "import sys, accel_ops; "
        "assert 'torch_xla' not in sys.modules, 'torch_xla imported eagerly'; "
        "from accel_state import PartialState; "
        "assert not PartialState._shared_state, 'PartialState was constructed'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    ("function", "first"),
    [
        (accel_ops.gather, "tensor"),
        (accel_ops.reduce, "tensor"),
        (accel_ops.broadcast, "tensor"),
        (accel_ops.pad_across_processes, "tensor"),
        (accel_ops.send_to_device, "tensor"),
        (accel_ops.convert_to_fp32, "tensor"),
        (accel_ops.copy_tensor_to_devices, "tensor"),
        (accel_ops.pad_input_tensors, "tensor"),
        (accel_ops.gather_object, "object"),
        (accel_ops.broadcast_object_list, "object_list"),
    ],
)
def test_first_parameter_has_accelerates_name(function, first):
    import inspect

    assert next(iter(inspect.signature(function).parameters)) == first


def test_partial_state_debug_drives_debug_mode_and_the_error_has_accelerates_name():
    from accel_state import PartialState

    state = PartialState(cpu=True)
    try:
        state.debug = True
        assert is_debug_mode()
        set_debug_mode(False)  # the explicit toggle still wins
        assert not is_debug_mode()
        set_debug_mode(None)
        state.debug = False
        assert not is_debug_mode()
    finally:
        PartialState._reset_state()
    assert accel_ops.DistributedOperationException is accel_ops.DistributedOperationError
