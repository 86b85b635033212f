"""Wrapping worker commands so that workers never outlive a launcher killed with SIGKILL."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_GUARD = Path(__file__).resolve().parent.parent / "_orphan_guard.py"


def guarded(command: list[str]) -> list[str]:
    """``command`` run through ``_orphan_guard.py`` with this process as the launcher to watch."""
    return [sys.executable, "-S", str(_GUARD), str(os.getpid()), *command]
