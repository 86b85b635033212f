"""Accelerate's ``accelerate.utils.random`` module path: seeding and RNG synchronisation."""

from __future__ import annotations

from accel_data import set_seed, synchronize_rng_state, synchronize_rng_states

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]
