"""Accelerate's ``accelerate.utils.tqdm`` path: the module is also the progress bar function.

``accel.utils.tqdm`` is the function (:func:`accel.utils.progress.tqdm`), as in Accelerate; a
script that imports the module path first (``import accel.utils.tqdm``) makes that attribute this
module, so the module is callable and calls the function.

Example:
    >>> from accel.utils.tqdm import tqdm
    >>> list(tqdm(range(2), disable=True))
    [0, 1]
"""

from __future__ import annotations

import sys
import types
from typing import Any

from accel.utils.progress import tqdm


class _CallableModule(types.ModuleType):
    """A module that, called, shows a progress bar (``accel.utils.tqdm(...)`` either way)."""

    def __call__(self, *args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
        return tqdm(*args, main_process_only=main_process_only, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["tqdm"]
