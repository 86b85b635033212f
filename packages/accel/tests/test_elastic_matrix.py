"""Elastic resume matrix: every strategy saves on 2 processes and resumes on 1, 3 and 4.

One save job (2 processes) runs every strategy of ``elastic_matrix_workers.REGISTRY`` in turn,
saving a mid-epoch and an epoch-boundary checkpoint; each resume job (M processes) loads both for
every strategy. After each load the gathered full model + optimizer state is bit-equal to the
saved one, and the samples the resumed job consumes are exactly the uninterrupted job's.
"""

from __future__ import annotations

import elastic_matrix_workers as workers
import pytest
import torch

from accel_state.testing import spawn_workers

# Hang guards only: on a loaded 2-core machine these multi-process jobs may take minutes.
pytestmark = pytest.mark.timeout(1200)

NAMES = list(workers.REGISTRY)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("elastic_matrix"))


@pytest.fixture(scope="module")
def saved(root: str) -> dict:
    reports = spawn_workers(workers.save_job, workers.SAVED_ON, args=(root, NAMES), timeout=900)
    return {**reports[0], "probes": [report["ddp"]["probe"] for report in reports]}


def test_the_uninterrupted_job_reads_every_sample_once_per_epoch(saved: dict) -> None:
    for name in NAMES:
        run = saved[name]
        assert len(run["before"]) == workers.MID, name
        assert sorted(run["before"] + run["after"]) == list(range(workers.SAMPLES)), name
        assert sorted(run["epoch1"]) == list(range(workers.SAMPLES)), name
        assert run["epoch1"] != run["before"] + run["after"], f"{name}: epoch 1 not reshuffled"


@pytest.mark.parametrize("world_size", workers.RESUME_SIZES)
def test_resume_on_m_processes_restores_state_and_sample_order(
    root: str, saved: dict, world_size: int
) -> None:
    reports = spawn_workers(workers.resume_job, world_size, args=(root, NAMES), timeout=900)
    for rank, report in enumerate(reports):
        for name in NAMES:
            where = f"strategy {name}, saved on {workers.SAVED_ON}, resumed on M={world_size}"
            got, want = report[name], saved[name]
            assert not got["mid"], f"{where}, mid-epoch checkpoint, rank {rank}: {got['mid']}"
            assert not got["boundary"], (
                f"{where}, epoch-boundary checkpoint, rank {rank}: {got['boundary']}"
            )
            assert got["rest"] == want["after"], f"{where}, mid-epoch checkpoint: samples differ"
            assert got["epoch1"] == want["epoch1"], f"{where}, epoch-boundary checkpoint: samples"
    ddp = [report["ddp"] for report in reports]
    for rank, run in enumerate(ddp):
        assert "iterable" in run["refusal"] and "num_processes=5" in run["refusal"]
        # RNG: ranks that saved restore their own stream; the others derive one deterministically.
        assert torch.equal(run["probe"], run["probe_again"]), f"M={world_size} rank {rank}"
        if rank < workers.SAVED_ON:
            assert torch.equal(run["probe"], saved["probes"][rank]), f"M={world_size} rank {rank}"
    probes = [tuple(run["probe"].tolist()) for run in ddp]
    assert len(set(probes)) == len(probes), f"M={world_size}: ranks share an RNG stream"
