"""Stale torch extension build locks are found, reported and removed; held ones are left alone."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from accel.utils import build_locks

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="needs /proc to tell which files are open (Linux)"
)


def _lock(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    lock = folder / "lock"
    lock.touch()
    return lock


def test_a_lock_no_process_holds_is_stale_and_one_a_builder_holds_is_not(tmp_path: Path) -> None:
    stale = _lock(tmp_path, "killed_op")
    held = _lock(tmp_path, "building_op")
    # A real builder: torch's FileBaton keeps the lock's descriptor open while it compiles.
    code = "import os, sys, time; os.open(sys.argv[1], os.O_RDONLY); print('open', flush=True); time.sleep(120)"
    builder = subprocess.Popen(
        [sys.executable, "-c", code, str(held)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert builder.stdout is not None and builder.stdout.readline().strip() == "open"
        assert build_locks.stale_build_locks(tmp_path) == [stale]
    finally:
        builder.kill()
        builder.wait(timeout=60)
    assert build_locks.stale_build_locks(tmp_path) == sorted([stale, held])


def test_the_warning_names_the_lock_the_op_and_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lock = _lock(tmp_path, "deepspeed_shm_comm")
    with caplog.at_level(logging.WARNING, logger="accel.utils.build_locks"):
        assert build_locks.warn_about_stale_build_locks(tmp_path) == [lock]
    message = caplog.text
    assert str(lock) in message and "'deepspeed_shm_comm'" in message
    assert f"rm {lock}" in message and "wait for the lock forever" in message


def test_the_command_lists_then_removes_and_the_root_follows_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = _lock(tmp_path / "py311_cpu", "fused_adam")  # torch's default layout nests a level
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert build_locks.extensions_root() == tmp_path
    assert build_locks.main([]) == 1
    assert f"stale build lock {lock}" in capsys.readouterr().out
    assert lock.exists()
    assert build_locks.main(["--remove"]) == 0
    assert not lock.exists() and lock.parent.is_dir()
    assert build_locks.main([]) == 0


def test_an_empty_or_missing_root_has_no_locks(tmp_path: Path) -> None:
    assert build_locks.stale_build_locks(tmp_path) == []
    assert build_locks.stale_build_locks(tmp_path / "missing") == []
