"""What ``accel estimate-memory`` and its engine share: dtype sizes and the spec error (no torch)."""

from __future__ import annotations

from accel.errors import AccelError

#: Bytes per parameter of each dtype the command knows (float16 and bfloat16 share a row size).
DTYPE_BYTES: dict[str, float] = {
    "float32": 4.0,
    "float16": 2.0,
    "bfloat16": 2.0,
    "int8": 1.0,
    "int4": 0.5,
}
#: Integer dtypes hold quantized weights for inference: no gradients, no optimizer.
INFERENCE_ONLY = frozenset({"int8", "int4"})


class ModelSpecError(AccelError, ValueError):
    """The model to measure cannot be found or built."""


class HubModelError(ModelSpecError, OSError):
    """The model is named as a Hugging Face Hub repo, which accel does not download.

    An ``OSError`` too, as the error for a model that cannot be obtained is in Accelerate.
    """
