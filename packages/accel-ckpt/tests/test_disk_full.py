"""A full disk during save_state: clear error, nothing half-written, the previous checkpoint stays.

On a size-limited tmpfs (where this machine lets the test mount one: root, or CAP_SYS_ADMIN), two
processes save; the check before writing finds too little space. Under ``RLIMIT_FSIZE`` (any
machine) a file grows past the limit while being written, the path a disk that fills up during the
save takes.
"""

from __future__ import annotations

import multiprocessing
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from disk_full_workers import save_small_then_too_big

from accel_state.testing import spawn_workers

TMPFS_BYTES = 256 * 1024
BIG_WIDTH = 512  # 512 x 512 float32: 1 MiB of weights


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 256 kB tmpfs, or a skip saying why none can be mounted here."""
    mount = tmp_path / "small"
    mount.mkdir()
    attempt = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if attempt.returncode != 0:
        pytest.skip(
            "cannot mount a size-limited tmpfs here (needs root or CAP_SYS_ADMIN): "
            f"{attempt.stderr.strip() or attempt.returncode}; the RLIMIT_FSIZE test covers the rest"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _check(result: dict, project: Path) -> None:
    assert result["left"] == ["checkpoint_0"], result  # no staging folder, no checkpoint_1
    assert result["latest"] == "checkpoint_0" and result["loaded_small"], result


def test_two_processes_saving_into_a_full_tmpfs(small_filesystem):
    project = small_filesystem / "project"
    results = spawn_workers(save_small_then_too_big, 2, args=(str(project), BIG_WIDTH), timeout=180)
    creator, other = results
    assert creator["disk_full"], creator
    message = creator["message"]
    assert "checkpoint_1" in message and str(small_filesystem) in message
    assert "1.0 MB" in message and "bytes" in message  # the bytes it needed
    assert "previous checkpoint stays the newest" in message
    assert (
        other["type"] == "DistributedCheckpointError"
        and "CheckpointDiskFullError" in other["message"]
    )
    for result in results:
        _check(result, project)


def test_a_file_size_limit_hit_while_writing(tmp_path):
    project = tmp_path / "project"
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:  # the limit applies to that process only
        result = pool.apply(save_small_then_too_big, (str(project), BIG_WIDTH, 64 * 1024))
    assert result["disk_full"], result
    message = result["message"]
    assert "File too large" in message and "RLIMIT_FSIZE" in message
    assert "checkpoint_1" in message and "model.safetensors" in message
    assert "had 1.0 MB" in message  # what this process had to write
    _check(result, project)
