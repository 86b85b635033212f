"""Read one key press from the terminal, arrow keys included.

Arrow keys arrive as the escape sequence ``ESC [ A..D``; :func:`get_character` returns them as
one character whose code is ``ARROW_KEY_FLAG`` plus the letter's code, as :data:`KEYMAP` lists.
"""

from __future__ import annotations

import string
import sys

ARROW_KEY_FLAG = 1 << 8
#: A key's name and the character code :func:`get_character` returns for it.
KEYMAP: dict[str, int] = {
    "tab": ord("\t"),
    "newline": ord("\r"),
    "esc": 27,
    "up": ARROW_KEY_FLAG + ord("A"),
    "down": ARROW_KEY_FLAG + ord("B"),
    "right": ARROW_KEY_FLAG + ord("C"),
    "left": ARROW_KEY_FLAG + ord("D"),
    "mod_int": 91,
    "undefined": 0x10FFFF,
    "interrupt": 3,
    "insert": 50,
    "delete": 51,
    "pg_up": 53,
    "pg_down": 54,
}
KEYMAP["arrow_begin"] = KEYMAP["up"]
KEYMAP["arrow_end"] = KEYMAP["left"]
for i in range(10):
    KEYMAP[str(i)] = ord(str(i))

__all__ = ["ARROW_KEY_FLAG", "KEYMAP", "get_character", "get_raw_chars"]


def get_raw_chars() -> str:
    """One character from stdin, read in raw mode (no echo, no waiting for Enter)."""
    if sys.platform == "win32":  # pragma: no cover - Windows only
        import msvcrt

        return msvcrt.getwch()
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        return sys.stdin.read(1)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def get_character() -> str:
    """One key press: a printable character, or ``chr(KEYMAP[name])`` for a named key."""
    char = get_raw_chars()
    if ord(char) in (KEYMAP["interrupt"], KEYMAP["newline"], ord("\n")):
        return chr(KEYMAP["newline"]) if char == "\n" else char
    if char == chr(KEYMAP["esc"]):
        follow = get_raw_chars()
        if follow == "[":
            code = ord(get_raw_chars())
            if ord("A") <= code <= ord("D"):
                return chr(ARROW_KEY_FLAG + code)
        return chr(KEYMAP["undefined"])
    if char in string.printable:
        return char
    return chr(KEYMAP["undefined"])
