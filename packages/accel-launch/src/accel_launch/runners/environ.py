"""Temporarily extend ``os.environ`` (workers inherit the launcher's environment)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def extended_environ(extra: Mapping[str, str]) -> Iterator[None]:
    """Add ``extra`` to ``os.environ`` for the block; afterwards restore it exactly as it was."""
    saved = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
