"""Replicated checkpoint files are read by one process and broadcast (3 real gloo processes)."""

from __future__ import annotations

import pytest
from shared_read_workers import shared_loads

from accel_state.testing import spawn_workers

WORLD = 3
SLACK = 64 * 1024  # the manifest, a safetensors header read twice, /proc reads themselves


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn_workers(
        shared_loads, WORLD, args=(str(tmp_path_factory.mktemp("shared")),), timeout=240
    )


def test_loads_are_bit_identical(results):
    for out in results:
        assert out["bitwise"] == dict.fromkeys(out["bitwise"], True), out["bitwise"]
        assert out["tied"]
        assert out["loaders"] == [(5, 1), (10 + out["rank"], out["rank"])]
        for name in ("single", "sharded", "pickled"):
            assert out[f"{name}_same"], name
            assert out[f"{name}_keys"] == ([], [])
    assert len(results[0]["sharded_sizes"]) > 2  # an index and several shards
    for out in results:  # travelled as torch.save bytes, rebuilt by the full unpickler
        assert out["odd"] is True
        kind, message = out["odd_refused"]
        assert kind == "UnsafeCheckpointError", message
        assert ("process 0" in message) == (out["rank"] != 0)


def test_only_the_reading_process_reads_the_files(results):
    sizes = results[0]["sizes"]
    own = {rank: sizes[f"random_states_{rank}.safetensors"] for rank in range(WORLD)}
    shared = sum(
        size for name, size in sizes.items() if not name.startswith(("random_states", "accel_"))
    )
    assert shared > 10_000
    first, *others = results
    assert first["load_state_read"] >= shared
    for out in others:
        assert out["load_state_read"] < own[out["rank"]] + sizes["accel_manifest.json"] + SLACK
    for name in ("single", "sharded", "pickled"):
        total = sum(first[f"{name}_sizes"].values())
        assert first[f"{name}_read"] >= total - 4096, name  # .bin: all but zip padding
        for out in others:
            assert out[f"{name}_read"] < SLACK, (name, out[f"{name}_read"])


def test_reading_errors_reach_every_process(results):
    for out in results:
        kind, message = out["missing"]
        assert kind == "CheckpointNotFoundError"
        assert "no-such-weights" in message
        assert ("process 0" in message) == (out["rank"] != 0)
        kind, message = out["mismatch"]
        assert kind == "StateDictMismatchError", message
        kind, message = out["corrupt"]
        assert kind == "CorruptCheckpointError"
        assert "CRC-32" in message
        assert out["models"][1] in message
        assert ("process 0" in message) == (out["rank"] != 0)
        assert out["after"] == list(range(WORLD))
