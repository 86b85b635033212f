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
    from accel.strategies.deepspeed_plugin import DeepSpeedEngineWrapper

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
    from accel.strategies.deepspeed_plugin import DeepSpeedPlugin

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
        return self._named_plugin(name, "get_deepspeed_plugin")

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the plugin ``name`` the one the next ``prepare`` builds its engine with.

        Raises:
            AcceleratorConfigError: ``name`` is not a registered plugin.
        """
        chosen = self._named_plugin(name, "select_deepspeed_plugin")
        for plugin in self._shared_state[STATE_KEY].values():
            plugin._unselect()
        chosen.select(_from_accelerator_state=True)
        self._shared_state[ACTIVE_KEY] = chosen

    def _named_plugin(self, name: str | None, method: str) -> Any:
        named = self._shared_state.get(STATE_KEY)
        if not named or name not in named:
            known = list(named) if named else []
            raise AcceleratorConfigError(
                f"{method}({name!r}): no DeepSpeed plugin of that name; registered: {known} "
                "(name them in the first Accelerator: "
                "Accelerator(deepspeed_plugins={name: DeepSpeedPlugin(...)}))."
            )
        return named[name]

    def _deepspeed_plugin_name(self, plugin: Any) -> str:
        """The plugin's name in ``deepspeed_plugins``, else ``"deepspeed_plugin"``."""
        named = self._shared_state.get(STATE_KEY) or {}
        return next((name for name, value in named.items() if value is plugin), ACTIVE_KEY)

    def _live_deepspeed_engines(self) -> list[tuple[Any, Any]]:
        """``(plugin, engine)`` of every training engine built and not yet freed, in order."""
        entries = self._shared_state.setdefault(ENGINES_KEY, [])
        entries[:] = [(plugin, ref) for plugin, ref in entries if ref() is not None]
        return [(plugin, ref()) for plugin, ref in entries]

    def _register_deepspeed_engine(self, plugin: Any, engine: Any) -> None:
        """Record a training engine built with ``plugin``."""
        self._live_deepspeed_engines()
        self._shared_state[ENGINES_KEY].append((plugin, weakref.ref(engine)))

    def _forget_deepspeed_engine(self, engine: Any) -> None:
        """Drop ``engine`` from the live training engines (``free_memory``)."""
        entries = self._shared_state.get(ENGINES_KEY, [])
        entries[:] = [(plugin, ref) for plugin, ref in entries if ref() is not engine]

    def _check_plugin_can_train(self, plugin: Any) -> None:
        """With named plugins, each trains one model: refuse a second training engine.

        Raises:
            PreparationError: ``plugin`` already built a live training engine.
        """
        if not self._shared_state.get(STATE_KEY):
            return
        if any(owner is plugin for owner, _ in self._live_deepspeed_engines()):
            name = self._deepspeed_plugin_name(plugin)
            raise PreparationError(
                f"The DeepSpeed plugin {name!r} (selected now) already trains a model through "
                "another Accelerator's engine; each named plugin trains one model. Select the "
                "plugin meant for this model first (accelerator.state.select_deepspeed_plugin"
                "(name)), or add one to the first Accelerator's deepspeed_plugins."
            )

    def _shared_accumulation_steps(
        self, plugin: Any, accelerator_steps: int, own_engine: Any = None
    ) -> int:
        """The accumulation steps an engine of ``plugin`` gets, given the engines alive.

        Every Accelerator of the process shares one ``GradientState``, so a new engine follows
        the live ones; the plugin and the Accelerator may only repeat their value.

        Raises:
            AcceleratorConfigError: ``plugin`` or the Accelerator asks for another value.
        """
        from accel.strategies.deepspeed_config import accumulation_steps, plugin_accumulation_steps

        live = [
            (owner, engine)
            for owner, engine in self._live_deepspeed_engines()
            if engine is not own_engine
        ]
        if not live:
            return accumulation_steps(plugin, accelerator_steps)
        owner, engine = live[0]
        steps = int(engine.gradient_accumulation_steps())
        asked = [
            (
                f"DeepSpeed plugin {self._deepspeed_plugin_name(plugin)!r}",
                plugin_accumulation_steps(plugin),
            )
        ]
        if accelerator_steps != 1:
            asked.append(("Accelerator(gradient_accumulation_steps=...)", accelerator_steps))
        for source, value in asked:
            if value is not None and value != steps:
                raise AcceleratorConfigError(
                    f"{source} asks for gradient_accumulation_steps={value}, but the engine of "
                    f"plugin {self._deepspeed_plugin_name(owner)!r} already trains with {steps}; "
                    "every Accelerator of a process shares one accumulation count "
                    f"(GradientState): set gradient_accumulation_steps={steps} there, or "
                    '"auto" in the DeepSpeed config.'
                )
        return steps


class DeepSpeedAcceleratorMixin:
    """The Accelerator's DeepSpeed members: the active plugin and the engine ``backward`` drives."""

    strategy: ModelStrategy
    state: Any

    @property
    def deepspeed_plugin(self) -> Any:
        """The :class:`~accel.DeepSpeedPlugin` in effect (with its resolved config), else ``None``."""
        return self.state._shared_state.get(ACTIVE_KEY)

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
