"""A tqdm progress bar shown on the local main process only."""

from __future__ import annotations

import types
from typing import Any

from accel_state import PartialState


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm`` that is disabled except on each machine's local main process.

    Args:
        *args: Passed to tqdm.
        main_process_only: Show the bar on the local main process only.
        **kwargs: Passed to tqdm.
    """
    from tqdm.auto import tqdm as progress_bar

    if main_process_only:
        kwargs["disable"] = kwargs.get("disable", False) or not PartialState().is_local_main_process
    return progress_bar(*args, **kwargs)


class CallableProgressModule(types.ModuleType):
    """A module that, called, shows a progress bar (``accel.utils.tqdm(...)`` either way)."""

    def __call__(self, *args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
        """Show a progress bar, as :func:`tqdm` does."""
        return tqdm(*args, main_process_only=main_process_only, **kwargs)
