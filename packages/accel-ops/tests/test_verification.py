"""Accelerate's operation decorators, dtype codes and shape exchange (accel_ops.verification)."""

import pytest
import torch
from _accel_ops_workers import verification_worker

import accel_ops
from accel_state.testing import spawn_workers


def test_dtype_codes_are_accelerates_and_invert():
    assert accel_ops.TENSOR_TYPE_TO_INT[torch.float] == 1
    assert accel_ops.TENSOR_TYPE_TO_INT[torch.bfloat16] == 4
    assert accel_ops.TENSOR_TYPE_TO_INT[torch.bool] == 10
    for dtype, code in accel_ops.TENSOR_TYPE_TO_INT.items():
        assert accel_ops.TENSOR_INT_TO_DTYPE[code] is dtype


def test_is_torch_xpu_tensor_is_false_off_xpu():
    assert not accel_ops.is_torch_xpu_tensor(torch.ones(1))
    assert not accel_ops.is_torch_xpu_tensor([1, 2])


def test_decorators_keep_the_function_and_pass_through_on_one_process():
    @accel_ops.chained_operation
    @accel_ops.verify_operation
    def double(tensor):
        """Twice."""
        return tensor * 2

    assert double.__name__ == "double" and double.__doc__ == "Twice."
    accel_ops.set_debug_mode(True)
    try:
        assert double(tensor=torch.ones(2)).tolist() == [2.0, 2.0]
    finally:
        accel_ops.set_debug_mode(None)


def test_chained_operation_names_the_outer_function_and_chains():
    @accel_ops.chained_operation
    def outer():
        raise accel_ops.DistributedOperationError("inner", "inner_op", ["p0", "p1"])

    with pytest.raises(
        accel_ops.DistributedOperationError, match="Error found while calling"
    ) as info:
        outer()
    assert "outer" in str(info.value)
    assert str(info.value.__cause__) == "inner"
    assert info.value.descriptions == ["p0", "p1"]


def test_gather_tensor_shape_on_one_process():
    shape, code = accel_ops.gather_tensor_shape(torch.zeros(4, 5, dtype=torch.int64))
    assert shape.tolist() == [4, 5]
    assert accel_ops.TENSOR_INT_TO_DTYPE[code] is torch.int64
    with pytest.raises(ValueError, match="one process must pass its tensor"):
        accel_ops.gather_tensor_shape(None)
    with pytest.raises(ValueError, match="the dtype has no code"):
        accel_ops.gather_tensor_shape(torch.zeros(1, dtype=torch.complex64))


def test_verification_on_two_real_processes():
    results = spawn_workers(verification_worker, 2, timeout=120)
    for result in results:
        assert result["same"] == [2.0, 2.0]
        message, cause = result["chained"]
        assert "Error found while calling" in message and "outer" in message
        assert "float32[1]" in cause and "float32[2]" in cause
        assert result["shape"] == [2, 3]
        assert result["dtype"] == "torch.int16"
