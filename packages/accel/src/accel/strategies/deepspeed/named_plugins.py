"""Several DeepSpeed plugins per Accelerator: a named set, one selected at a time.

``Accelerator(deepspeed_plugin={"training": DeepSpeedPlugin(...), "inference": ...})`` keeps every
plugin on the :class:`~accel.state.AcceleratorState`; the first is selected. The next
``prepare`` builds its engine with the selected plugin, so one model can train under ZeRO-2 while
another runs inference under ZeRO-3 (``state.select_deepspeed_plugin("inference")`` before
preparing it). :class:`DeepSpeedPluginsMixin` gives the state its Accelerate-named methods.

Two models that both train get one Accelerator each (Accelerate's way): create a second
``Accelerator()`` (it shares the state and its plugins), select the other plugin, prepare the
second model and optimizer with it; each Accelerator's ``backward`` drives its own engine
(``accelerator.deepspeed_engine_wrapped``, see :class:`DeepSpeedAcceleratorMixin`). The state
keeps the live training engines so that each named plugin trains one model and all of them
accumulate over the same number of micro-steps (one ``GradientState`` per process).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from accel.errors import AcceleratorConfigError, PreparationError

if TYPE_CHECKING:
    from accel.strategies.base import ModelStrategy
    from accel.strategies.deepspeed.plugin import DeepSpeedEngineWrapper

STATE_KEY = "deepspeed_plugins"
ACTIVE_KEY = "deepspeed_plugin"
ENGINES_KEY = "deepspeed_training_engines"


def one_deepspeed_argument(plugin: Any, plugins: Any) -> Any:
    """``deepspeed_plugin`` or Accelerate's ``deepspeed_plugins`` (a plugin or a dict of them).

    Raises:
        AcceleratorConfigError: Both were given.
    """
    if plugins is not None and plugin is not None:
        raise AcceleratorConfigError(
            "deepspeed_plugin and deepspeed_plugins were both given; pass one of them."
        )
    return plugins if plugins is not None else plugin


def split_deepspeed_plugins(plugin: Any, plugins: Any) -> tuple[Any, dict[str, Any] | None]:
    """``(selected plugin, named plugins or None)`` from the Accelerator's two arguments.

    Either argument may be one plugin or a dict of named plugins (Accelerate treats
    ``deepspeed_plugin`` as an alias of ``deepspeed_plugins``). With a dict, its first plugin is
    selected.

    Raises:
        AcceleratorConfigError: Both arguments given, an empty dict, a name that is not a
            string, or a value that is not a ``DeepSpeedPlugin``.
    """
    from accel.strategies.deepspeed.plugin import DeepSpeedPlugin

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


def refuse_plugins_for_existing_state(shared: Mapping[str, Any], given: Any) -> None:
    """A second Accelerator may not bring DeepSpeed plugins of its own (Accelerate refuses too).

    Passing the very plugin (or dict of plugins) the state already holds is harmless and allowed.

    Raises:
        AcceleratorConfigError: ``given`` is not what the existing state holds.
    """
    if given is None:
        return
    named = shared.get(STATE_KEY)
    if given is shared.get(ACTIVE_KEY) or (
        named is not None
        and isinstance(given, Mapping)
        and list(given) == list(named)
        and all(given[name] is named[name] for name in named)
    ):
        return
    held = (
        f"the plugins {list(named)}"
        if named
        else "its DeepSpeed plugin"
        if shared.get(ACTIVE_KEY) is not None
        else "no DeepSpeed plugin"
    )
    raise AcceleratorConfigError(
        "Accelerator(deepspeed_plugin(s)=...): this process's AcceleratorState already exists "
        f"with {held}; a later Accelerator shares them and cannot bring its own. Pass every "
        "plugin to the first Accelerator (deepspeed_plugins={name: DeepSpeedPlugin(...)}), create "
        "the others with Accelerator() and pick one with "
        "accelerator.state.select_deepspeed_plugin(name) before preparing."
    )


class DeepSpeedPluginRegistry:
    """The process's DeepSpeed plugins and live training engines, over the state's record.

    One exists per ``AcceleratorState`` record; the state hands it to the DeepSpeed strategy
    (through :class:`~accel.run_config.RunConfig`), which never looks the state up.

    Args:
        record: The dict the entries live in (the ``AcceleratorState``'s shared record).
    """

    def __init__(self, record: dict[str, Any]) -> None:
        self._record = record

    @property
    def active(self) -> Any:
        """The selected plugin (the only one, without named plugins), else ``None``."""
        return self._record.get(ACTIVE_KEY)

    @active.setter
    def active(self, plugin: Any) -> None:
        """Make ``plugin`` the selected one (the launcher's plugin, made at ``prepare``)."""
        self._record[ACTIVE_KEY] = plugin

    @property
    def named(self) -> dict[str, Any] | None:
        """The named plugins (a dict), else ``None``."""
        return self._record.get(STATE_KEY)

    def plugin_named(self, name: str | None, method: str) -> Any:
        """The plugin registered as ``name``.

        Raises:
            AcceleratorConfigError: No named plugins, or none called ``name`` (``method`` names
                the caller in the message).
        """
        named = self.named
        if not named or name not in named:
            known = list(named) if named else []
            raise AcceleratorConfigError(
                f"{method}({name!r}): no DeepSpeed plugin of that name; registered: {known} "
                "(name them in the first Accelerator: "
                "Accelerator(deepspeed_plugins={name: DeepSpeedPlugin(...)}))."
            )
        return named[name]

    def select(self, name: str | None) -> None:
        """Make the plugin ``name`` the selected one.

        Raises:
            AcceleratorConfigError: ``name`` is not a registered plugin.
        """
        chosen = self.plugin_named(name, "select_deepspeed_plugin")
        for plugin in (self.named or {}).values():
            plugin._unselect()
        chosen.select(_from_accelerator_state=True)
        self.active = chosen

    def name_of(self, plugin: Any) -> str:
        """The plugin's name in ``deepspeed_plugins``, else ``"deepspeed_plugin"``."""
        named = self.named or {}
        return next((name for name, value in named.items() if value is plugin), ACTIVE_KEY)

    def live_engines(self) -> list[tuple[Any, Any]]:
        """``(plugin, engine)`` of every training engine built and not yet freed, in order."""
        entries = self._record.setdefault(ENGINES_KEY, [])
        entries[:] = [(plugin, ref) for plugin, ref in entries if ref() is not None]
        return [(plugin, ref()) for plugin, ref in entries]

    def register_engine(self, plugin: Any, engine: Any) -> None:
        """Record a training engine built with ``plugin``."""
        self.live_engines()
        self._record[ENGINES_KEY].append((plugin, weakref.ref(engine)))

    def forget_engine(self, engine: Any) -> None:
        """Drop ``engine`` from the live training engines (``free_memory``)."""
        entries = self._record.get(ENGINES_KEY, [])
        entries[:] = [(plugin, ref) for plugin, ref in entries if ref() is not engine]

    def check_plugin_can_train(self, plugin: Any) -> None:
        """With named plugins, each trains one model: refuse a second training engine.

        Raises:
            PreparationError: ``plugin`` already built a live training engine.
        """
        if not self.named:
            return
        if any(owner is plugin for owner, _ in self.live_engines()):
            name = self.name_of(plugin)
            raise PreparationError(
                f"The DeepSpeed plugin {name!r} (selected now) already trains a model through "
                "another Accelerator's engine; each named plugin trains one model. Select the "
                "plugin meant for this model first (accelerator.state.select_deepspeed_plugin"
                "(name)), or add one to the first Accelerator's deepspeed_plugins."
            )

    def accumulation_steps(
        self, plugin: Any, accelerator_steps: int, own_engine: Any = None
    ) -> int:
        """The accumulation steps an engine of ``plugin`` gets, given the engines alive.

        Every Accelerator of the process shares one ``GradientState``, so a new engine follows
        the live ones; the plugin and the Accelerator may only repeat their value.

        Raises:
            AcceleratorConfigError: ``plugin`` or the Accelerator asks for another value.
        """
        from accel.strategies.deepspeed.config import accumulation_steps, plugin_accumulation_steps

        live = [
            (owner, engine) for owner, engine in self.live_engines() if engine is not own_engine
        ]
        if not live:
            return accumulation_steps(plugin, accelerator_steps)
        owner, engine = live[0]
        steps = int(engine.gradient_accumulation_steps())
        asked = [(f"DeepSpeed plugin {self.name_of(plugin)!r}", plugin_accumulation_steps(plugin))]
        if accelerator_steps != 1:
            asked.append(("Accelerator(gradient_accumulation_steps=...)", accelerator_steps))
        for source, value in asked:
            if value is not None and value != steps:
                raise AcceleratorConfigError(
                    f"{source} asks for gradient_accumulation_steps={value}, but the engine of "
                    f"plugin {self.name_of(owner)!r} already trains with {steps}; "
                    "every Accelerator of a process shares one accumulation count "
                    f"(GradientState): set gradient_accumulation_steps={steps} there, or "
                    '"auto" in the DeepSpeed config.'
                )
        return steps


class DeepSpeedPluginsMixin:
    """``AcceleratorState`` members for named DeepSpeed plugins (Accelerate's names)."""

    _shared_state: ClassVar[dict[str, Any]]

    @property
    def deepspeed_registry(self) -> DeepSpeedPluginRegistry:
        """The plugins and live engines of this state, as the DeepSpeed strategy receives them."""
        return DeepSpeedPluginRegistry(self._shared_state)

    @property
    def deepspeed_plugins(self) -> Any:
        """The named plugins (a dict), else the single plugin, else ``None``."""
        registry = self.deepspeed_registry
        named = registry.named
        return named if named is not None else registry.active

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The plugin registered as ``name``.

        Raises:
            AcceleratorConfigError: No named plugins, or none called ``name``.
        """
        return self.deepspeed_registry.plugin_named(name, "get_deepspeed_plugin")

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the plugin ``name`` the one the next ``prepare`` builds its engine with.

        Raises:
            AcceleratorConfigError: ``name`` is not a registered plugin.
        """
        self.deepspeed_registry.select(name)


class DeepSpeedAcceleratorMixin:
    """The Accelerator's DeepSpeed members: the active plugin and the engine ``backward`` drives."""

    strategy: ModelStrategy
    state: Any

    @property
    def deepspeed_plugin(self) -> Any:
        """The :class:`~accel.DeepSpeedPlugin` in effect (with its resolved config), else ``None``."""
        return self.state.deepspeed_registry.active

    @property
    def deepspeed_engine_wrapped(self) -> DeepSpeedEngineWrapper | None:
        """The :class:`~accel.utils.DeepSpeedEngineWrapper` of this Accelerator's training engine.

        ``None`` until a model and its optimizer are prepared; absent (``AttributeError``) when
        the job does not use DeepSpeed, as in Accelerate.
        """
        if not hasattr(self.strategy, "engine_wrapped"):
            raise AttributeError(
                "'Accelerator' object has no attribute 'deepspeed_engine_wrapped' (it exists "
                "under DeepSpeed only)"
            )
        return self.strategy.engine_wrapped  # type: ignore[no-any-return]

    @deepspeed_engine_wrapped.setter
    def deepspeed_engine_wrapped(self, value: DeepSpeedEngineWrapper | None) -> None:
        """Replace (or with ``None`` drop) the engine wrapper ``backward`` drives."""
        if not hasattr(self.strategy, "engine_wrapped"):
            raise AcceleratorConfigError(
                "accelerator.deepspeed_engine_wrapped can only be set under DeepSpeed; this "
                f"Accelerator uses {self.state.distributed_type}."
            )
        self.strategy.engine_wrapped = value
