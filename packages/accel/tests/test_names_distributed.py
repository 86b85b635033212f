"""Issue 28's names where they are distributed, on 2 processes over gloo (one launch), and the
``accelerator.print`` after ``end_training()`` regression on one process.

The 2-process checks run in one spawned job (names_workers.names_job): restarting the state with
a new Accelerator several times, ``prepare_data_loader(slice_fn_for_dispatch=)`` with dispatched
batches and ``GradientState.dataloader_references``, ``load_checkpoint_in_model(full_state_dict=
True, broadcast_from_rank0=True)`` into an FSDP2 model, ``get_cpu_distributed_information`` and
``set_numa_affinity``, ``GeneralTracker.start`` per process, ``RNGType``'s new members, and ``accelerator.print`` after ``end_training()``.
"""

from __future__ import annotations

import os
from typing import Any

import names_workers
import pytest

from accel import Accelerator
from accel_state import reset_state
from accel_state.testing import spawn_workers

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("names")
    return spawn_workers(names_workers.names_job, 2, args=(str(folder),), timeout=480)


def test_reset_state_and_a_new_accelerator_restart_cleanly_many_times(ranks):
    for rank in ranks:
        assert rank["restarts"] == [2.0, 2.0, 2.0]


def test_slice_fn_for_dispatch_cuts_each_dispatched_batch(ranks):
    first, second = (rank["slices"] for rank in ranks)
    # Default dispatch: rank 0 reads both processes' batches and each gets its own rows.
    assert first["default"] == [[0.0, 1.0, 2.0, 3.0], [8.0, 9.0, 10.0, 11.0]]
    assert second["default"] == [[4.0, 5.0, 6.0, 7.0], [12.0, 13.0, 14.0, 15.0]]
    for rank, index in ((first, 0), (second, 1)):
        assert rank["custom"] == [[-x for x in batch] for batch in rank["default"]]
        assert rank["slice_kwargs"] == {"process_index": index, "num_processes": 2}
        assert rank["references_after"] == [None]
        assert rank["active_during"] == [True, True]


def test_full_state_dict_broadcast_from_rank0_fills_every_shard(ranks):
    for rank in ranks:
        found = rank["full_broadcast"]
        assert found["all_dtensor"] and found["restored"]
        assert found["local_weight_rows"] == 3  # 6 rows over 2 ranks
        assert found["missing"] == [] and found["unexpected"] == []


def test_cpu_information_and_numa_affinity_per_rank(ranks):
    infos = [rank["cpu"]["info"] for rank in ranks]
    assert infos == [(0, 2, 0, 2), (1, 2, 1, 2)]
    pinned = [set(rank["cpu"]["after"]) for rank in ranks]
    for rank, cores in zip(ranks, pinned, strict=True):
        assert cores and cores <= set(rank["cpu"]["before"])
    if len(set(ranks[0]["cpu"]["before"])) >= 2:
        from accel_launch.affinity import numa_nodes

        if len(numa_nodes()) <= 1:
            assert not pinned[0] & pinned[1], "two local processes share no core on one node"


def test_tracker_start_per_process_and_new_rng_types_refused_on_every_rank(ranks):
    first, second = (rank["trackers_rng"] for rank in ranks)
    started = ["start", "config {'lr': 0.1}", "log {'loss': 1.0}"]
    assert first["main_only"] == started and second["main_only"] == []
    assert first["everywhere"] == started and second["everywhere"] == started
    for rank in (first, second):
        assert rank["hpu"].startswith("RNGSyncError") and "rng_type='hpu'" in rank["hpu"]


def test_print_after_end_training_prints_on_the_main_process_only(ranks):
    first, second = (rank["print_after_end"] for rank in ranks)
    assert first["printed"] == "after the end 0\n"
    assert second["printed"] == ""
    assert (first["is_main_process"], second["is_main_process"]) == (True, False)
    assert [first["process_index"], second["process_index"]] == [0, 1]
    assert first["num_processes"] == second["num_processes"] == 2


def test_print_after_end_training_on_one_process(capsys):
    reset_state()
    try:
        accelerator = Accelerator(cpu=True)
        accelerator.end_training()
        accelerator.print("still here")
        assert capsys.readouterr().out == "still here\n"
        assert accelerator.is_main_process and accelerator.num_processes == 1
        # A new Accelerator after the end reads the new state, not the recorded facts.
        again = Accelerator(cpu=True)
        assert again.is_main_process and accelerator.process_index == 0
    finally:
        reset_state()


def test_numa_affinity_on_one_process_keeps_an_allowed_core():
    from accel.utils import get_cpu_distributed_information, set_numa_affinity

    before = os.sched_getaffinity(0)
    try:
        info = get_cpu_distributed_information({"RANK": "0", "WORLD_SIZE": "1"})
        assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (0, 1, 0, 1)
        set_numa_affinity(0)
        assert os.sched_getaffinity(0) and os.sched_getaffinity(0) <= before
    finally:
        os.sched_setaffinity(0, before)
