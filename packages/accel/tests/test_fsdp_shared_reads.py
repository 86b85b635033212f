"""Accelerator.load_state on 3 processes: replicated files are read once, by process 0."""

from __future__ import annotations

import fsdp_shared_read_workers
import pytest

from accel_state.testing import spawn_workers

# Hang guard only: a loaded 2-core machine may take minutes for a 3-process job.
pytestmark = [pytest.mark.timeout(600), pytest.mark.torch_feature("fsdp2")]
WORLD = 3


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shared_reads")
    job = fsdp_shared_read_workers.full_state_reads
    return spawn_workers(job, WORLD, args=(str(folder),), timeout=500)


@pytest.mark.parametrize("mode", ["ddp", "fsdp2_full"])
def test_load_state_is_bit_identical_and_reads_once(results, mode):
    sizes = results[0][f"{mode}_sizes"]
    own = {r: sizes[f"random_states_{r}.safetensors"] for r in range(WORLD)}
    shared = sum(
        size for name, size in sizes.items() if not name.startswith(("random_states", "accel_"))
    )
    assert shared > 50_000
    first, *others = results
    assert first[f"{mode}_read"] >= shared
    for out in results:
        assert out[f"{mode}_bitwise"], (mode, out["rank"])
    for out in others:
        bound = own[out["rank"]] + sizes["accel_manifest.json"] + fsdp_shared_read_workers.SLACK
        assert out[f"{mode}_read"] < bound, (mode, out["rank"], out[f"{mode}_read"])


def test_a_damaged_full_state_file_fails_on_every_process(results):
    for out in results:
        kind, message = out["damaged"]
        assert kind == "CorruptCheckpointError", message
        assert "optimizer.pt" in message
        assert ("process 0" in message) == (out["rank"] != 0)
        assert out["after"] == list(range(WORLD))
