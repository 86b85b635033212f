"""The dtype names of the safetensors format and their torch equivalents."""

from __future__ import annotations

import enum

import torch

from accel_ckpt.errors import CorruptCheckpointError, UnsupportedValueError


class CustomDtype(enum.Enum):
    """Storage types torch has no dtype for, used to size quantized weights when planning."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"

    @property
    def bits(self) -> int:
        """Bits per element."""
        return {"fp8": 8, "int4": 4, "int2": 2}[self.value]


def _table() -> dict[str, torch.dtype]:
    names = {
        "F64": "float64",
        "F32": "float32",
        "F16": "float16",
        "BF16": "bfloat16",
        "I64": "int64",
        "I32": "int32",
        "I16": "int16",
        "I8": "int8",
        "U64": "uint64",
        "U32": "uint32",
        "U16": "uint16",
        "U8": "uint8",
        "BOOL": "bool",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
        "C64": "complex64",
    }
    table = {}
    for code, attribute in names.items():
        dtype = getattr(torch, attribute, None)
        if isinstance(dtype, torch.dtype):
            table[code] = dtype
    return table


SAFETENSORS_TO_TORCH: dict[str, torch.dtype] = _table()
TORCH_TO_SAFETENSORS: dict[torch.dtype, str] = {v: k for k, v in SAFETENSORS_TO_TORCH.items()}


def safetensors_code(dtype: torch.dtype, name: str) -> str:
    """The safetensors code of ``dtype``; ``name`` is the tensor, for the error message."""
    code = TORCH_TO_SAFETENSORS.get(dtype)
    if code is None:
        raise UnsupportedValueError(
            f"Tensor {name!r} has dtype {dtype}, which safetensors cannot store; "
            f"convert it to one of {sorted(str(d) for d in TORCH_TO_SAFETENSORS)} first."
        )
    return code


def torch_dtype(code: str, name: str, path: str) -> torch.dtype:
    """The torch dtype of safetensors ``code`` for tensor ``name`` in file ``path``."""
    dtype = SAFETENSORS_TO_TORCH.get(code)
    if dtype is None:
        raise CorruptCheckpointError(
            f"{path}: tensor {name!r} has dtype {code!r}, unknown to this torch "
            f"({torch.__version__}); known: {sorted(SAFETENSORS_TO_TORCH)}."
        )
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """``"float32"`` -> ``torch.float32``."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise UnsupportedValueError(f"{name!r} is not a torch dtype.")
    return dtype
