"""FSDP2 reads the shards whatever the last forward was (2 gloo processes, one spawned job).

After a forward with no backward, FSDP2's root keeps its gathered parameters, so
``model.parameters()`` names gathered stand-ins instead of the sharded ``DTensor`` parameters the
optimizer steps. Every path that reads parameters must still see the shards: for no layer units
(the root holds everything) and for transformer-layer units, after a training step, a ``no_grad``
evaluation, ``model.eval()`` forwards of two batch sizes, and in the middle of accumulation.
"""

from __future__ import annotations

from typing import Any

import fsdp_read_workers
import pytest

from accel_state.testing import spawn_workers

PATHS = [
    "get_state_dict",
    "get_state_dict_raw",
    "unwrap_model",
    "clip_grad_norm_",
    "clip_grad_value_",
    "save_model",
    "save_state_then_load_state",
    "optimizer_state_restored",
]
# Hang guard only: the module's one spawned job may take minutes on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(1200)
CELLS = [
    f"{policy}/{last_forward}"
    for policy in fsdp_read_workers.POLICIES
    for last_forward in fsdp_read_workers.LAST_FORWARDS
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("fsdp-after-forward")
    return spawn_workers(fsdp_read_workers.read_paths_job, 2, args=(str(folder),), timeout=900)


@pytest.mark.parametrize("cell", CELLS)
def test_every_path_reads_the_shards_after_any_last_forward(
    results: list[dict[str, Any]], cell: str
) -> None:
    for rank, result in enumerate(results):
        paths = dict(result[cell])
        norm, truth = paths.pop("clip_norm_and_truth")
        if rank != 0:
            assert "save_model" not in paths  # written by the main process only
            paths["save_model"] = True
        failed = [path for path in PATHS if paths[path] is not True]
        assert not failed, f"rank {rank}, {cell}: {failed} (clip norm {norm}, truth {truth})"
        assert sorted(paths) == sorted(PATHS)


def test_evaluation_leaves_gathered_parameters_that_clipping_must_not_miss(
    results: list[dict[str, Any]],
) -> None:
    """The cells after an evaluation pass had real gradients to clip (the norm is not 0)."""
    for result in results:
        for cell in ("no_wrap/no_grad_eval", "block_wrap/eval_mode_batches"):
            norm, truth = result[cell]["clip_norm_and_truth"]
            assert truth > 0 and norm == pytest.approx(truth, rel=1e-5)


def test_an_optimizer_built_after_an_evaluation_pass_trains_the_shards(
    results: list[dict[str, Any]],
) -> None:
    assert all(result["optimizer_built_after_evaluation_trains"] for result in results)
