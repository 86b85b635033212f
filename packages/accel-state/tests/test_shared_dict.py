"""Accelerate's SharedDict / ThreadLocalSharedDict / do_nothing (accel_state.shared)."""

import importlib.util
import threading

from accel_state.shared import SharedDict, ThreadLocalSharedDict, do_nothing


class _Borg:
    _shared_state = ThreadLocalSharedDict()

    def __init__(self, **values):
        self.__dict__ = self._shared_state
        self.__dict__.update(values)


def test_thread_local_shared_dict_is_shared_by_instances_and_the_class():
    _Borg._shared_state.clear()
    first = _Borg(device="cpu")
    second = _Borg()
    assert second.device == "cpu"
    assert _Borg._shared_state is first._shared_state is second.__dict__
    first._shared_state = {"replaced": True}
    assert _Borg._shared_state == {"replaced": True}
    _Borg._shared_state.clear()


def test_thread_local_shared_dict_gives_each_thread_its_own_dictionary():
    _Borg._shared_state.clear()
    _Borg(device="main")
    seen = {}

    def other_thread():
        seen["before"] = dict(_Borg._shared_state)
        _Borg(device="worker")
        seen["after"] = dict(_Borg._shared_state)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen == {"before": {}, "after": {"device": "worker"}}
    assert _Borg._shared_state == {"device": "main"}
    _Borg._shared_state.clear()


def test_shared_dict_is_dict_without_torch_xla():
    expected = ThreadLocalSharedDict if importlib.util.find_spec("torch_xla") else dict
    assert SharedDict is expected


def test_do_nothing_takes_anything():
    assert do_nothing() is None
    assert do_nothing(1, 2, key="value") is None


def test_base_enum_prints_its_value_and_contains_values():
    from accel_state.types import BaseEnum

    class Color(BaseEnum):
        RED = "red"
        BLUE = "blue"

    assert str(Color.RED) == "red"
    assert Color.list() == ["red", "blue"]
    assert "red" in Color and "green" not in Color
    assert Color.BLUE in Color
