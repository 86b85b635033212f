"""``accel`` subcommands that other installed packages provide, through entry points.

A package adds a command by declaring, in its ``pyproject.toml``::

    [project.entry-points."accel.commands"]
    merge-weights = "accel_ckpt.commands:register_merge_weights"

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

    A command that fails to load, or a known one whose package is absent, still gets a parser:
    running it prints why and how to fix it, with exit code 1.

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
            _add_unavailable(commands, name, _missing_reason(name, KNOWN_COMMANDS[name]))
        else:
            try:
                register: Register = entry.load()
                register(commands)
            except Exception as error:  # noqa: BLE001 - a broken plugin must not break `accel`
                _add_unavailable(
                    commands,
                    name,
                    f"the {name} command of {entry.value} failed to load: "
                    f"{type(error).__name__}: {error}",
                )
        added.append(name)
    return added


def _missing_reason(name: str, package: str) -> str:
    try:
        installed = version(package)
    except PackageNotFoundError:
        return f"install {package} for {name} (pip install {package})"
    return f"{package} {installed} is installed but provides no {name} command; upgrade {package}"


def _add_unavailable(commands: Any, name: str, reason: str) -> None:
    # No option prefix a real argument can start with: whatever follows is taken as it is.
    parser = commands.add_parser(
        name, help=f"(unavailable: {reason})", add_help=False, prefix_chars="\0"
    )
    parser.add_argument("rest", nargs=argparse.REMAINDER)

    def explain(_args: argparse.Namespace) -> int:
        raise MissingDependencyError(reason)

    parser.set_defaults(handler=explain)
