"""Ending the process group never hangs or aborts a 2-process job, however the script ends it.

Each ending (``PartialState``/``AcceleratorState.destroy_process_group()``, the script's own
``torch.distributed.destroy_process_group()``, ``end_training()``, ``reset_state()`` then a new
Accelerator, and plain interpreter exit with live wrappers) runs 20 times on 2 forked processes
that prepare DDP models in a function, train, end the group, return and exit
(``group_endings_script.py``). Before accel-state kept groups alive (``accel_state.group_keeper``),
a reducer freed on return dropped the destroyed group's last reference while a gloo worker thread
waited for the GIL: with the keeper disabled, 2 to 9 repetitions in 10 of each ending that
returns from a function hang (measured on 2 busy cores), so 20 repetitions miss a broken
ending about once in a hundred runs at worst, and all five together practically never.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import weakref
from pathlib import Path

import group_endings_script
import pytest
import torch.distributed as dist

import accel_state
from accel_state.group_keeper import free_destroyed_groups, kept_group_count
from accel_state.process_group import start_single_process_group, stop_process_group
from accel_state.torch_compat import group_free_releases_gil

SCRIPT = Path(group_endings_script.__file__)
REPEATS = 20


@pytest.fixture(scope="module")
def endings_output() -> str:
    """Every ending, ``REPEATS`` repetitions each, in one driver (one warm-up for all)."""
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(REPEATS), *group_endings_script.ENDINGS],
        cwd=SCRIPT.parent,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    return run.stdout + run.stderr


# Hang guard only: 20 repetitions of all 6 endings take about a minute on 2 busy cores.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("ending", group_endings_script.ENDINGS)
def test_every_ending_leaves_20_two_process_jobs_that_exit_cleanly(
    endings_output: str, ending: str
) -> None:
    line = f"{ending}: {REPEATS} of {REPEATS} repetitions ended cleanly"
    assert line in endings_output.splitlines(), endings_output[-8000:]


def test_a_destroyed_group_is_kept_until_it_is_freed_with_no_group_running() -> None:
    start_single_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    world = weakref.ref(dist.group.WORLD)
    assert kept_group_count() >= 1
    stop_process_group()
    assert not dist.is_initialized()
    # Destroyed and dropped by torch, still kept: no other holder can drop the last reference.
    assert world() is not None
    assert free_destroyed_groups() >= 1
    assert kept_group_count() == 0
    # Freed; on torch < 2.9, whose group destructor holds the GIL, kept for the process's life.
    assert (world() is None) == group_free_releases_gil()
    accel_state.reset_state()


def test_the_next_group_start_frees_the_destroyed_ones() -> None:
    start_single_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    first = weakref.ref(dist.group.WORLD)
    stop_process_group()
    start_single_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        assert (first() is None) == group_free_releases_gil()  # see the test above
        assert dist.group.WORLD is not None
    finally:
        stop_process_group()
        free_destroyed_groups()


def test_nothing_is_freed_while_a_default_group_runs() -> None:
    start_single_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        assert dist.is_initialized()
        kept = kept_group_count()
        assert free_destroyed_groups() == 0
        assert kept_group_count() == kept
    finally:
        stop_process_group()
        free_destroyed_groups()
