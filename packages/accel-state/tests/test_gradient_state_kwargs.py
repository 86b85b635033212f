"""``GradientState.plugin_kwargs`` and its fallbacks, as Accelerate keeps them (issue 57)."""

from __future__ import annotations

from typing import Any

import pytest

from accel_state import GradientState

pytestmark = pytest.mark.usefixtures("clean_state")


class _Plugin:
    """A stand-in plugin: only ``to_kwargs()`` matters to ``GradientState``."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def to_kwargs(self) -> dict[str, Any]:
        return dict(self.kwargs)


def test_without_a_plugin_the_dict_is_empty_and_properties_fall_back() -> None:
    state = GradientState()
    assert state.plugin_kwargs == {}
    assert state.num_steps == 1
    assert state.adjust_scheduler is False
    assert state.sync_with_dataloader is True
    assert state.sync_each_batch is False


def test_plugin_kwargs_is_the_plugins_to_kwargs_and_nothing_more() -> None:
    state = GradientState(_Plugin(num_steps=4))
    assert state.plugin_kwargs == {"num_steps": 4}
    assert (state.num_steps, state.adjust_scheduler, state.sync_with_dataloader) == (4, False, True)


def test_a_later_plugin_replaces_the_dict_and_none_keeps_it() -> None:
    GradientState(_Plugin(num_steps=4, sync_with_dataloader=False))
    assert GradientState().plugin_kwargs == {"num_steps": 4, "sync_with_dataloader": False}
    GradientState(_Plugin(num_steps=2))
    assert GradientState().plugin_kwargs == {"num_steps": 2}  # replaced, not merged
    assert GradientState().sync_with_dataloader is True
    GradientState(None)
    assert GradientState().plugin_kwargs == {"num_steps": 2}


def test_writing_num_steps_into_the_dict_is_read_back() -> None:
    state = GradientState()
    state.plugin_kwargs["num_steps"] = 8  # what the DeepSpeed strategy and the setter do
    assert GradientState().num_steps == 8
    state.plugin_kwargs["adjust_scheduler"] = True
    assert GradientState().adjust_scheduler is True


def test_a_mapping_is_taken_as_the_kwargs_and_unknown_keys_are_refused() -> None:
    assert GradientState({"num_steps": 3}).plugin_kwargs == {"num_steps": 3}
    with pytest.raises(ValueError, match=r"Unknown gradient accumulation settings \['steps'\]"):
        GradientState({"steps": 3})
    assert GradientState().plugin_kwargs == {"num_steps": 3}  # the refused one changed nothing
