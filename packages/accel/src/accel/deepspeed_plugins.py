"""Several DeepSpeed plugins per Accelerator: a named set, one selected at a time.

``Accelerator(deepspeed_plugin={"training": DeepSpeedPlugin(...), "inference": ...})`` keeps every
plugin on the :class:`~accel.state.AcceleratorState`; the first is selected. The next
``prepare`` builds its engine with the selected plugin, so one model can train under ZeRO-2 while
another runs inference under ZeRO-3 (``state.select_deepspeed_plugin("inference")`` before
preparing it). :class:`DeepSpeedPluginsMixin` gives the state its Accelerate-named methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from accel.errors import AcceleratorConfigError

STATE_KEY = "deepspeed_plugins"
ACTIVE_KEY = "deepspeed_plugin"


def split_deepspeed_plugins(plugin: Any, plugins: Any) -> tuple[Any, dict[str, Any] | None]:
    """``(selected plugin, named plugins or None)`` from the Accelerator's two arguments.

    Either argument may be one plugin or a dict of named plugins (Accelerate treats
    ``deepspeed_plugin`` as an alias of ``deepspeed_plugins``). With a dict, its first plugin is
    selected.

    Raises:
        AcceleratorConfigError: Both arguments given, an empty dict, a name that is not a
            string, or a value that is not a ``DeepSpeedPlugin``.
    """
    from accel.utils.deepspeed import DeepSpeedPlugin

    if plugin is not None and plugins is not None:
        raise AcceleratorConfigError(
            "deepspeed_plugin and deepspeed_plugins were both given; pass one of them."
        )
    given = plugins if plugins is not None else plugin
    if not isinstance(given, Mapping):
        return given, None
    if not given:
        raise AcceleratorConfigError(
            "Accelerator(deepspeed_plugins={}): give at least one name -> DeepSpeedPlugin."
        )
    for name, value in given.items():
        if not isinstance(name, str) or not isinstance(value, DeepSpeedPlugin):
            raise AcceleratorConfigError(
                f"Accelerator(deepspeed_plugins=...): entry {name!r}: {type(value).__name__} -- "
                "each entry maps a string name to a DeepSpeedPlugin."
            )
    named = dict(given)
    first = next(iter(named.values()))
    for value in named.values():
        value._unselect()
    first.select(_from_accelerator_state=True)
    return first, named


class DeepSpeedPluginsMixin:
    """``AcceleratorState`` members for named DeepSpeed plugins (Accelerate's names)."""

    _shared_state: ClassVar[dict[str, Any]]

    @property
    def deepspeed_plugins(self) -> Any:
        """The named plugins (a dict), else the single plugin, else ``None``."""
        named = self._shared_state.get(STATE_KEY)
        return named if named is not None else self._shared_state.get(ACTIVE_KEY)

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The plugin registered as ``name``.

        Raises:
            AcceleratorConfigError: No named plugins, or none called ``name``.
        """
        named = self._shared_state.get(STATE_KEY)
        if not named or name not in named:
            known = list(named) if named else []
            raise AcceleratorConfigError(
                f"get_deepspeed_plugin({name!r}): no DeepSpeed plugin of that name; registered: "
                f"{known} (pass Accelerator(deepspeed_plugin={{name: DeepSpeedPlugin(...)}}))."
            )
        return named[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the plugin ``name`` the one the next ``prepare`` builds its engine with.

        Raises:
            AcceleratorConfigError: ``name`` is not a registered plugin.
        """
        chosen = self.get_deepspeed_plugin(name if name is not None else "")
        for plugin in self._shared_state[STATE_KEY].values():
            plugin._unselect()
        chosen.select(_from_accelerator_state=True)
        self._shared_state[ACTIVE_KEY] = chosen
