"""DeepSpeed ZeRO-1/2/3 checkpoints saved on 2 processes resume on 1, 3 and 4.

Mid-epoch and at the epoch boundary: the gathered full state (fp32 master weights, Adam moments,
step, module weights) after loading is bit-equal to the saved one, and the samples the resumed
job consumes are exactly the uninterrupted job's remaining ones, in order. Loading on another
data-parallel world size goes through DeepSpeed's universal checkpoint (converted once, beside
the checkpoint); one save launch and one launch per resume world size cover the three stages.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import elastic_deepspeed_workers as workers
import pytest
import torch

from accel_state.testing import spawn_workers

# Hang guards only: on a loaded 2-core machine these multi-process jobs may take minutes.
pytestmark = [
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"
    ),
]


#: The universal folder of each checkpoint, as the first resume left it (later ones reuse it).
CONVERTED: dict[Path, tuple[int, int]] = {}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("elastic_deepspeed")
    ranks = spawn_workers(workers.save_job, 2, args=(str(folder),), timeout=900)
    for stage in workers.STAGES:
        engine_folder = folder / f"zero{stage}" / "mid" / "deepspeed"
        # Loaded on the process count it was saved on: DeepSpeed's own format, nothing converted.
        assert not (engine_folder / "universal").exists()
        _assert_equal(ranks[0][stage]["same_count"], ranks[0][stage]["mid"])
        # What a conversion killed half-way leaves; the next one clears it.
        crashed = engine_folder / ".universal.accel-tmp-dead" / "engine"
        crashed.mkdir(parents=True)
        (crashed / "half.pt").write_bytes(b"torn")
    return folder, ranks[0]


def _assert_equal(loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(loaded) == sorted(expected)
    assert any(key.startswith("exp_avg_sq.") for key in expected)
    different = [key for key in expected if not torch.equal(loaded[key], expected[key])]
    assert not different, f"not bit-equal after loading: {different}"


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_zero_checkpoint_saved_on_two_resumes_on_another_count(
    saved: tuple[Path, dict[int, dict[str, Any]]], world_size: int
) -> None:
    folder, uninterrupted = saved
    resumed = spawn_workers(workers.resume_job, world_size, args=(str(folder),), timeout=900)
    for stage in workers.STAGES:
        run = uninterrupted[stage]
        assert sorted(run["before"] + run["after"]) == list(range(workers.SAMPLES))
        assert sorted(run["epoch1"]) == list(range(workers.SAMPLES))
        assert not all(torch.equal(run["mid"][k], run["boundary"][k]) for k in run["mid"])
        for point in ("mid", "boundary"):
            engine_folder = folder / f"zero{stage}" / point / "deepspeed"
            universal = engine_folder / "universal"
            assert (universal / "engine").is_dir() and (universal / "latest_universal").is_file()
            assert not list(engine_folder.glob(".universal.accel-tmp-*"))
            # Converted once: a later load on another count reuses the complete conversion.
            identity = (universal.stat().st_ino, universal.stat().st_mtime_ns)
            assert CONVERTED.setdefault(universal, identity) == identity
        for rank in resumed:
            result = rank[stage]
            _assert_equal(result["mid"], run["mid"])
            _assert_equal(result["boundary"], run["boundary"])
            assert result["rest"] == run["after"]
            assert result["mid_epoch1"] == run["epoch1"]
            assert result["epoch1"] == run["epoch1"]
    if world_size == 1:  # ZeRO-3's universal load restores Adam's states only: a clear refusal
        refusal = resumed[0][3]["refusal"]
        assert "ZeRO-3" in refusal and "SGD" in refusal and "load on 2 processes" in refusal
