"""``accel`` subcommands that other installed packages provide, through entry points.

A package adds a command by declaring, in its ``pyproject.toml``::

    [project.entry-points."accel.commands"]
    merge-weights = "accel_ckpt.cli:register_merge_weights"

The entry point's name is the subcommand; its object is ``register(subparsers)``, which adds a
parser and sets ``handler`` (``handler(args) -> exit code``) as its default. accel-launch itself
depends only on accel-state: a known command whose package is missing answers with the package
to install instead of "invalid choice".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version
from typing import Any

from accel_launch.errors import MissingDependencyError

ENTRY_POINT_GROUP = "accel.commands"

# Commands other accel packages provide, and the distribution that provides each.
KNOWN_COMMANDS = {
    "estimate-memory": "accel",
    "merge-weights": "accel-ckpt",
}

Register = Callable[[Any], None]


def discover() -> dict[str, EntryPoint]:
    """The installed ``accel.commands`` entry points by command name (first one wins)."""
    found: dict[str, EntryPoint] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry.name, entry)
    return found


def add_plugin_commands(commands: Any, reserved: set[str]) -> list[str]:
    """Add every discovered command to ``commands`` (an argparse subparsers object).

    Nothing of the providing package is imported here (importing it may import torch, and
    ``accel --help`` must stay fast): each command gets a stand-in parser that takes the rest of
    the command line, and the entry point is loaded only when the command runs. A command that
    fails to load, or a known one whose package is absent, prints why and how to fix it, with
    exit code 1.

    Args:
        commands: The ``add_subparsers()`` object of the ``accel`` parser.
        reserved: Built-in command names, which entry points cannot replace.

    Returns:
        The names added, in order.
    """
    added: list[str] = []
    discovered = discover()
    for name in sorted(set(discovered) | set(KNOWN_COMMANDS)):
        if name in reserved:
            continue
        entry = discovered.get(name)
        if entry is None:
            _add_stand_in(
                commands, name, "unavailable", _explain(_missing_reason(name, KNOWN_COMMANDS[name]))
            )
        else:
            provider = entry.dist.name if entry.dist is not None else entry.value
            _add_stand_in(commands, name, f"from {provider}", _deferred(name, entry))
        added.append(name)
    return added


def run_plugin_command(name: str, entry: EntryPoint, argv: list[str]) -> int:
    """Load ``entry``, let it register ``name`` on a fresh parser, parse ``argv`` and run it."""
    try:
        register: Register = entry.load()
        parser = argparse.ArgumentParser(prog="accel", allow_abbrev=False)
        register(parser.add_subparsers(dest="command"))
    except Exception as error:  # a broken plugin gets a message, not a traceback
        raise MissingDependencyError(
            f"the {name} command of {entry.value} failed to load: {type(error).__name__}: {error}"
        ) from error
    args = parser.parse_args([name, *argv])
    handler = getattr(args, "handler", None)
    if handler is None:
        raise MissingDependencyError(
            f"{entry.value} did not register a {name} command with a handler; upgrade "
            f"{entry.dist.name if entry.dist is not None else 'its package'}."
        )
    return int(handler(args))


def _deferred(name: str, entry: EntryPoint) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        return run_plugin_command(name, entry, list(args.rest))

    return run


def _explain(reason: str) -> Callable[[argparse.Namespace], int]:
    def explain(_args: argparse.Namespace) -> int:
        raise MissingDependencyError(reason)

    return explain


def _missing_reason(name: str, package: str) -> str:
    try:
        installed = version(package)
    except PackageNotFoundError:
        return f"install {package} for {name} (pip install {package})"
    return f"{package} {installed} is installed but provides no {name} command; upgrade {package}"


def _add_stand_in(
    commands: Any, name: str, note: str, handler: Callable[[argparse.Namespace], int]
) -> None:
    # No option prefix a real argument can start with: whatever follows is taken as it is and
    # parsed by the command's own parser (``--help`` included).
    parser = commands.add_parser(name, help=f"({note})", add_help=False, prefix_chars="\0")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(handler=handler)
