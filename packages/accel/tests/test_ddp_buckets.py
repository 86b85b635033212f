"""DDP's buckets kept across a resume (``accel.strategies.ddp.buckets``), on 3 and 4 gloo ranks.

The everyday script's resume at 2, 3 and 4 processes is in ``test_everyday_matrix.py``; here the
hook alone: the same sum as DDP's own, and an exact resume only when the saved layout is used.
"""

from __future__ import annotations

import ddp_bucket_workers as workers
import pytest

from accel_state.testing import spawn_workers


@pytest.mark.parametrize("world_size", [3, 4])
def test_the_hook_sums_as_ddp_and_a_resume_in_the_saved_buckets_is_exact(world_size: int) -> None:
    results = spawn_workers(workers.sums_and_resumes, world_size, timeout=240)
    for out in results:
        assert out["hook_equals_ddp"], out  # bit for bit DDP's built-in path
        assert out["layout_was_rebuilt"] and out["buckets"] >= 2, out
        assert out["resumed_in_saved_layout"], out
        assert out["resumed_after_the_first_step"], out  # saved before DDP made its rebuild
        # Without the saved layout the first resumed step sums in DDP's initial bucket: the
        # weights differ in the last bits (this is what the layout in the checkpoint fixes).
        assert not out["resumed_in_initial_layout"], out
