"""A gloo timeout raised outside accel's collectives reaches the user explained, not raw."""

import re
from pathlib import Path

import pytest
from launched_jobs import start

SCRIPT = Path(__file__).with_name("raw_timeout_script.py")


@pytest.mark.timeout(300)  # hang guard only
@pytest.mark.parametrize(
    ("where", "operation"),
    [("ddp", "DistributedDataParallel._pre_forward"), ("raw", "all_reduce")],
)
def test_a_raw_gloo_timeout_is_translated_naming_the_operation_the_line_and_the_silent_rank(
    where, operation
):
    job = start(SCRIPT, ["--collective_timeout", "5"], [where])
    output, _ = job.communicate(timeout=240)
    assert job.returncode == 1, output[-6000:]
    name = re.escape(f"torch {operation}")
    assert re.search(
        rf"CollectiveTimeoutError: {name} #\d+ \(called at raw_timeout_script\.py:\d+\) timed "
        r"out on rank 0 of 2 after \d+\.\d s",
        output,
    ), output[-6000:]
    assert re.search(
        rf"rank 0 waits in {name} #\d+ \(raw_timeout_script\.py:\d+, outside accel's", output
    )
    assert re.search(r"Silent: rank 1 on ", output), output[-6000:]
    # gloo's own words are kept only as the backend's, shortened: never as the error raised.
    assert "Timed out waiting" not in output, output[-6000:]
    assert "rank 0 (local rank 0" in output and "(first failure)" in output
