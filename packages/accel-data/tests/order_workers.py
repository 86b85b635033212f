"""The order comparison run inside spawned worker processes (importable by module name)."""

from __future__ import annotations

from order_cases import CASES, plain_and_prepared

from accel_state import PartialState


def order_job(cases: list[str], epochs: int, split: bool) -> dict:
    """Per case: this process's plain PyTorch run and its prepared run, from a per-process seed."""
    rank = PartialState().process_index
    return {
        name: plain_and_prepared(CASES[name], 100 + 10 * rank, epochs, split_batches=split)
        for name in cases
    }
