"""``accel.utils.memory.clear_device_cache``: the garbage collection is Accelerate's opt-in."""

import gc
import weakref

from accel.utils.memory import clear_device_cache, release_memory


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _unreachable_cycle() -> weakref.ref[_Cycle]:
    return weakref.ref(_Cycle())


def test_clear_device_cache_collects_garbage_only_when_asked():
    gc.disable()
    try:
        ref = _unreachable_cycle()
        clear_device_cache()  # Accelerate's default: no gc.collect() (it is slow)
        assert ref() is not None
        clear_device_cache(garbage_collection=True)
        assert ref() is None
    finally:
        gc.enable()


def test_release_memory_still_collects_garbage():
    gc.disable()
    try:
        ref = _unreachable_cycle()
        assert release_memory(object(), object()) == [None, None]
        assert ref() is None
    finally:
        gc.enable()
