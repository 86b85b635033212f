"""Shared fixtures: a clean single-process state and no background saves left behind."""

from __future__ import annotations

import contextlib

import pytest

from accel_ckpt import AccelCkptError, wait_for_pending_saves


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch):
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        monkeypatch.delenv(name, raising=False)
    yield
    with contextlib.suppress(AccelCkptError):  # a test that expected the failure saw it already
        wait_for_pending_saves()
