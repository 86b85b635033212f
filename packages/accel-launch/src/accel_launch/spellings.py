"""Accelerate's hyphenated flag spellings (``--num-processes``) beside the underscored ones.

:func:`add_hyphenated_spellings` gives every ``--multi_word`` option of a parser a
``--multi-word`` twin that sets the same destination; the help lists only the underscored one.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence


def _hyphenated(option: str) -> str | None:
    """``--num_processes`` -> ``--num-processes``; ``None`` when there is nothing to change."""
    if not option.startswith("--") or "_" not in option[2:]:
        return None
    return "--" + option[2:].replace("_", "-")


def _is_twin(option: str, options: Sequence[str]) -> bool:
    """Whether ``option`` is the hyphenated twin of another option in ``options``."""
    return (
        option.startswith("--")
        and "-" in option[2:]
        and "--" + option[2:].replace("-", "_") in options
    )


class OneSpellingHelpFormatter(argparse.HelpFormatter):
    """Help that shows each option once: the hyphenated twins are left out."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = [o for o in action.option_strings if not _is_twin(o, action.option_strings)]
        if len(shown) == len(action.option_strings):
            return super()._format_action_invocation(action)
        trimmed = copy.copy(action)
        trimmed.option_strings = shown
        return super()._format_action_invocation(trimmed)


def add_hyphenated_spellings(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Accept ``--a-b`` wherever ``parser`` accepts ``--a_b``; call after adding the arguments.

    Returns:
        ``parser``, whose help now uses :class:`OneSpellingHelpFormatter`.
    """
    for action in parser._actions:
        for option in list(action.option_strings):
            twin = _hyphenated(option)
            if twin is not None and twin not in parser._option_string_actions:
                action.option_strings = [*action.option_strings, twin]
                parser._option_string_actions[twin] = action
    parser.formatter_class = OneSpellingHelpFormatter
    return parser
