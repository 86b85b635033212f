"""Value parsers for config keys: each turns a raw YAML or command-line value into a checked one.

A parser is called as ``parser(key, value)`` where ``key`` is what the error message names (a
dotted config key or a ``--flag``). It returns the normalised value or raises
:class:`~accel_launch.errors.ConfigError` naming the key, the value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from accel_launch.errors import ConfigError

Parser = Callable[[str, Any], Any]

_TRUE = {"1", "true", "yes", "y", "on"}
_FALSE = {"0", "false", "no", "n", "off"}
BOOL_SPELLINGS = ["true", "false", "yes", "no", "1", "0", "on", "off"]


def parse_bool(key: str, value: Any) -> bool:
    """Accept YAML booleans and the strings true/false, yes/no, 1/0, on/off (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise ConfigError("is not a boolean", key=key, value=value, allowed=BOOL_SPELLINGS)


def int_parser(minimum: int | None = None, maximum: int | None = None) -> Parser:
    """Return a parser for integers in ``[minimum, maximum]`` (integral strings accepted)."""

    def parse(key: str, value: Any) -> int:
        if isinstance(value, bool):
            raise ConfigError("must be an integer, not a boolean", key=key, value=value)
        if isinstance(value, int):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            number = int(value.strip())
        else:
            raise ConfigError("is not an integer", key=key, value=value)
        if minimum is not None and number < minimum:
            raise ConfigError(f"must be >= {minimum}", key=key, value=value)
        if maximum is not None and number > maximum:
            raise ConfigError(f"must be <= {maximum}", key=key, value=value)
        return number

    return parse


def float_parser(minimum: float | None = None, exclusive: bool = False) -> Parser:
    """Return a parser for numbers ``>= minimum`` (``> minimum`` when ``exclusive``)."""

    def parse(key: str, value: Any) -> float:
        if isinstance(value, bool):
            raise ConfigError("must be a number, not a boolean", key=key, value=value)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError("is not a number", key=key, value=value) from None
        if minimum is not None and (number <= minimum if exclusive else number < minimum):
            bound = f"> {minimum}" if exclusive else f">= {minimum}"
            raise ConfigError(f"must be {bound}", key=key, value=value)
        return number

    return parse


def parse_str(key: str, value: Any) -> str:
    """Accept a string (numbers are turned into their text)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError("must be a string", key=key, value=value)
    return str(value).strip()


def parse_csv(key: str, value: Any) -> str:
    """Accept a comma-separated string, a number, or a list of strings (joined with commas)."""
    if isinstance(value, (list, tuple)):
        return ",".join(parse_str(key, item) for item in value)
    return parse_str(key, value)


def choice_parser(
    choices: Sequence[str], case: str = "upper", aliases: dict[str, str] | None = None
) -> Parser:
    """Return a parser accepting one of ``choices``, compared after upper- or lower-casing.

    Args:
        choices: Canonical spellings.
        case: ``"upper"``, ``"lower"`` or ``"exact"``: how the value is normalised first.
        aliases: Extra accepted spellings (normalised the same way) and their canonical value.
    """
    extra = dict(aliases or {})

    def parse(key: str, value: Any) -> str:
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise ConfigError("must be a string", key=key, value=value, allowed=choices)
        text = str(value).strip()
        if case == "upper":
            text = text.upper()
        elif case == "lower":
            text = text.lower()
        if text in extra:
            return extra[text]
        if text not in choices:
            raise ConfigError("is not a valid choice", key=key, value=value, allowed=choices)
        return text

    return parse


def parse_any(key: str, value: Any) -> Any:
    """Accept any value as it is (keys accel keeps but does not interpret)."""
    return value
