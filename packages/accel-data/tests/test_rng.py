"""set_seed and RNG synchronisation in one process (the job-wide behaviour is in test_multiprocess)."""

import random

import pytest
import torch

from accel_data import RNGSyncError, set_seed, synchronize_rng_state, synchronize_rng_states

try:
    import numpy
except ImportError:  # numpy is optional for accel-data
    numpy = None


def draws():
    numbers = (random.random(), float(torch.rand(1)))
    return numbers if numpy is None else (*numbers, float(numpy.random.rand()))


def test_set_seed_seeds_python_numpy_and_torch():
    set_seed(42)
    first = draws()
    set_seed(42)
    assert draws() == first
    set_seed(43)
    assert draws() != first
    set_seed(42, device_specific=True)  # process 0 of 1: the seed is unchanged
    assert draws() == first


def test_set_seed_deterministic(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda flag: calls.append(flag))
    set_seed(1, deterministic=True)
    assert calls == [True]


def test_synchronisation_is_a_no_op_in_one_process():
    generator = torch.Generator().manual_seed(5)
    before = generator.get_state()
    synchronize_rng_states(["torch", "generator"], generator=generator)
    assert torch.equal(generator.get_state(), before)
    synchronize_rng_state()


def test_synchronisation_errors_name_the_problem():
    with pytest.raises(RNGSyncError, match="rng_type='dice'"):
        synchronize_rng_state("dice")
    with pytest.raises(RNGSyncError, match="needs generator="):
        synchronize_rng_state("generator")


@pytest.mark.parametrize("kind", ["mlu", "sdaa", "musa", "hpu", "neuron"])
def test_accelerate_only_devices_are_named_in_a_clear_error(kind):
    with pytest.raises(RNGSyncError, match=f"rng_type='{kind}' needs a {kind.upper()} device"):
        synchronize_rng_state(kind)
