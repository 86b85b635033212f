"""RNG states for a process that a checkpoint saved by fewer processes has none for."""

from __future__ import annotations

import random

import torch

from accel_ckpt.rng_state import capture_rng_states, derive_rng_states, restore_rng_states


def _draws() -> tuple[list[float], float]:
    return torch.rand(3).tolist(), random.random()


def test_a_derived_stream_is_deterministic_per_rank_and_distinct_from_the_source():
    torch.manual_seed(7)
    random.seed(7)
    saved = capture_rng_states()
    restore_rng_states(saved, "saved")
    source = _draws()
    derived = {}
    for rank in (2, 3, 2):
        derive_rng_states(saved, rank, "saved")
        draws = _draws()
        assert derived.setdefault(rank, draws) == draws  # same checkpoint, same rank: same stream
    assert derived[2] != derived[3]
    assert source not in derived.values()
