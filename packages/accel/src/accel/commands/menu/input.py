"""Key bindings for menus: mark methods with the keys they handle; dispatch a key press.

Example:
    >>> @register
    ... class Menu:
    ...     @mark(KEYMAP["up"])
    ...     def move_up(self) -> str:
    ...         return "up"
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from accel.commands.menu.keymap import KEYMAP, get_character

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["KEYMAP", "KeyHandler", "mark", "mark_multiple", "register"]


def mark(key: str | int) -> Callable[[F], F]:
    """Bind the decorated method to ``key`` (a character, or a code from :data:`KEYMAP`)."""
    return mark_multiple(key)


def mark_multiple(*keys: str | int) -> Callable[[F], F]:
    """Bind the decorated method to each of ``keys``."""

    def decorator(func: F) -> F:
        bound: list[str] = list(getattr(func, "handle_key", []))
        bound += [chr(key) if isinstance(key, int) else key for key in keys]
        func.handle_key = bound  # type: ignore[attr-defined]
        return func

    return decorator


def _handle_input(self: Any) -> Any:
    """Read one key press and call the method bound to it (``None`` when none is)."""
    char = get_character()
    handler = type(self).key_handler.get(char)
    if handler is None:
        return None
    self.current_selection = char
    return handler(self)


class KeyHandler(type):
    """Metaclass collecting the marked methods into ``key_handler`` and adding ``handle_input``."""

    def __new__(mcs, name: str, bases: tuple[type, ...], attrs: dict[str, Any]) -> KeyHandler:
        """Create the class with ``key_handler`` (key -> method) and ``handle_input``."""
        cls = super().__new__(mcs, name, bases, attrs)
        handlers: dict[str, Callable[..., Any]] = {}
        for value in attrs.values():
            for key in getattr(value, "handle_key", []):
                handlers[key] = value
        cls.key_handler = handlers  # type: ignore[attr-defined]
        cls.handle_input = _handle_input  # type: ignore[attr-defined]
        return cls


def register(cls: type) -> Any:
    """Rebuild ``cls`` with :class:`KeyHandler` so that its marked methods handle key presses."""
    attrs = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    return KeyHandler(cls.__name__, cls.__bases__, attrs)
