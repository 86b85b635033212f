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

from accel.progress import CallableProgressModule, tqdm

sys.modules[__name__].__class__ = CallableProgressModule

__all__ = ["tqdm"]
