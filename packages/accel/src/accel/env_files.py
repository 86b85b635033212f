r"""Environment files (DeepSpeed's ``.deepspeed_env``) written as Accelerate's utils write them.

The lines come from :func:`accel_launch.environment.convert_dict_to_env_variables`; the entries
left out are logged on ``accel.utils.environment``, the twin of Accelerate's logger path.

Example:
    >>> convert_dict_to_env_variables({"A": "1"})
    ['A=1\n']
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from accel_launch import environment as _launch_environment

_LOGGER = logging.getLogger("accel.utils.environment")


def convert_dict_to_env_variables(current_env: Mapping[str, str]) -> list[str]:
    """Turn ``{"A": "1"}`` into the lines ``A=1`` of an environment file.

    Entries that would break such a file are left out with a warning on
    ``accel.utils.environment`` (the twin of Accelerate's logger), as Accelerate does.
    """
    return _launch_environment.convert_dict_to_env_variables(current_env, log=_LOGGER)
