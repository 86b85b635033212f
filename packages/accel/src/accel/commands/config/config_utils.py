"""Accelerate's ``accelerate.commands.config.config_utils``: the help formatter of ``accel config``.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(formatter_class=SubcommandHelpFormatter)
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from accel_launch.config.schema import DYNAMO_BACKENDS

__all__ = ["DYNAMO_BACKENDS", "SubcommandHelpFormatter"]


class SubcommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks; a subcommand's usage line omits the ``{a,b}`` list."""

    def _format_usage(
        self,
        usage: str | None,
        actions: Iterable[argparse.Action],
        groups: Iterable[argparse._MutuallyExclusiveGroup],
        prefix: str | None,
    ) -> str:
        text = super()._format_usage(usage, actions, groups, prefix)
        for action in actions:
            if isinstance(action, argparse._SubParsersAction) and action.choices:
                text = text.replace("{" + ",".join(action.choices) + "} ...", "<command> ...")
        return text
