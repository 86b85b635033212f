"""A tiny linear-regression dataset and model (y = a * x + b) for training tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class RegressionDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """``length`` samples ``{"x": x, "y": a * x + b + noise}`` with float32 numpy scalars.

    Args:
        a: Slope.
        b: Intercept.
        length: Number of samples.
        seed: Seed of the generator drawing ``x`` and the noise (None: unseeded).
    """

    def __init__(
        self, a: float = 2, b: float = 3, length: int = 64, seed: int | None = None
    ) -> None:
        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        noise = rng.normal(scale=0.1, size=(length,)).astype(np.float32)
        self.y = (a * self.x + b + noise).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": self.x[index], "y": self.y[index]}


class RegressionModel(torch.nn.Module):
    """``forward(x) = x * a + b`` with scalar parameters ``a`` and ``b``."""

    def __init__(self, a: float = 0, b: float = 0, double_output: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(float(a)))
        self.b = torch.nn.Parameter(torch.tensor(float(b)))
        self.double_output = double_output

    def forward(self, x: torch.Tensor | None = None) -> Any:
        """The prediction (twice, as a tuple, with ``double_output``)."""
        if x is None:
            raise ValueError("RegressionModel.forward(x=None): pass the input batch as x.")
        out = x * self.a + self.b
        return (out, out) if self.double_output else out
