"""A mid-epoch checkpoint saved on 2 processes resumes on 1 and 3 with exactly the samples left."""

from __future__ import annotations

import elastic_workers
import pytest

from accel_state.testing import spawn_workers

# Hang guards only: on a loaded 2-core machine these multi-process jobs may take minutes.
pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
def test_saved_on_two_resumed_on_one_and_three_sees_the_remaining_samples(tmp_path, fsdp):
    saved = spawn_workers(elastic_workers.save_job, 2, args=(str(tmp_path), fsdp), timeout=600)
    uninterrupted = saved[0]
    assert sorted(uninterrupted["before"] + uninterrupted["after"]) == list(range(48))
    # FSDP needs a process group: accel refuses it on a single process, so FSDP2 resumes on 3.
    for world_size in (3,) if fsdp else (1, 3):
        resumed = spawn_workers(
            elastic_workers.resume_job, world_size, args=(str(tmp_path), fsdp), timeout=600
        )
        for rank in resumed:
            assert rank["rest"] == uninterrupted["after"]
            assert rank["epoch1"] == uninterrupted["epoch1"]
            assert "iterable" in rank["refusal"] and "num_processes=5" in rank["refusal"]
