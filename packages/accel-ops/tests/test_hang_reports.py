"""A rank that skips a collective: every rank raises, naming its own and the others' positions."""

import pathlib

import pytest
from _accel_ops_workers import skipped_collective_worker

from accel_state.testing import spawn_workers

WORKERS = "_accel_ops_workers.py"
TIMEOUT = 3


def _line(marker: str) -> int:
    lines = (pathlib.Path(__file__).parent / WORKERS).read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if text.rstrip().endswith(marker))


@pytest.mark.parametrize("operation", ["gather", "gather_object"])
def test_a_skipped_collective_times_out_on_every_rank_with_both_positions(operation):
    results = spawn_workers(
        skipped_collective_worker,
        2,
        args=(operation,),
        timeout=180,
        env={"ACCEL_PROCESS_GROUP_TIMEOUT": str(TIMEOUT)},
    )
    waits_0 = f"waits in {operation} #2 ({WORKERS}:{_line(f'# rank 0: {operation}')}"
    waits_1 = f"waits in reduce #2 ({WORKERS}:{_line('# rank 1: skipped it')}, float32[3])"
    for rank, result in enumerate(results):
        message = result["message"]
        assert message is not None, f"rank {rank} did not time out"
        own = operation if rank == 0 else "reduce"
        assert message.startswith(f"{own} #2 (called at {WORKERS}:"), message
        assert f"on rank {rank} of 2" in message
        assert f"rank 0 {waits_0}" in message and f"rank 1 {waits_1}" in message, message
        assert "reduce #1" in message  # the previous collective, done
        assert result["descriptions"][0].startswith(waits_0)
        assert result["cause"] == "None"  # gloo's raw timeout is summarised, not chained
        # A hang deadline, not a speed check: the timeout plus the few seconds spent collecting
        # the other ranks' positions.
        assert result["seconds"] < TIMEOUT + 10
