"""Elastic resume matrix: every strategy saves on 2 processes and resumes on 1, 3 and 4.

One save job (2 processes) runs every strategy of ``elastic_matrix_workers.REGISTRY`` in turn,
saving a mid-epoch and an epoch-boundary checkpoint; each resume job (M processes) loads both for
every strategy. After each load the gathered full model + optimizer state is bit-equal to the
saved one, and the samples the resumed job consumes are exactly the uninterrupted job's. Under
DeepSpeed (ZeRO-1/2/3, where deepspeed is installed) another process count loads through
DeepSpeed's universal checkpoint, converted once beside the checkpoint; the same count loads
DeepSpeed's own files unconverted.
"""

from __future__ import annotations

from pathlib import Path

import elastic_matrix_workers as workers
import pytest
import torch

from accel_state.testing import spawn_workers

# Hang guards only: on a loaded 2-core machine these multi-process jobs may take minutes.
pytestmark = pytest.mark.timeout(1800)

NAMES = list(workers.REGISTRY)
ZERO_NAMES = [name for name in NAMES if name in workers.ZERO_ROWS]
#: Each DeepSpeed checkpoint's universal folder as the first resume left it (later ones reuse it).
CONVERTED: dict[Path, tuple[int, int]] = {}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("elastic_matrix"))


@pytest.fixture(scope="module")
def saved(root: str) -> dict:
    reports = spawn_workers(workers.save_job, workers.SAVED_ON, args=(root, NAMES), timeout=1500)
    for name in ZERO_NAMES:
        for point in ("mid", "boundary"):
            engine_folder = Path(root) / name / point / "deepspeed"
            # Loaded on the count it was saved on: DeepSpeed's own format, nothing converted.
            assert not (engine_folder / "universal").exists(), f"{name} {point}"
            # What a conversion killed half-way leaves; the next one clears it.
            torn = engine_folder / ".universal.accel-tmp-dead" / "engine"
            torn.mkdir(parents=True)
            (torn / "half.pt").write_bytes(b"torn")
    return {**reports[0], "probes": [report["ddp"]["probe"] for report in reports]}


def test_the_uninterrupted_job_reads_every_sample_once_per_epoch(saved: dict) -> None:
    for name in NAMES:
        run = saved[name]
        assert len(run["before"]) == workers.MID, name
        assert sorted(run["before"] + run["after"]) == list(range(workers.SAMPLES)), name
        assert sorted(run["epoch1"]) == list(range(workers.SAMPLES)), name
        assert run["epoch1"] != run["before"] + run["after"], f"{name}: epoch 1 not reshuffled"
        assert not run["same_count"], f"{name}, reloaded on 2 processes: {run['same_count']}"


@pytest.mark.parametrize("world_size", workers.RESUME_SIZES)
def test_resume_on_m_processes_restores_state_and_sample_order(
    root: str, saved: dict, world_size: int
) -> None:
    reports = spawn_workers(workers.resume_job, world_size, args=(root, NAMES), timeout=1500)
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
    for name in ZERO_NAMES:
        for point in ("mid", "boundary"):
            engine_folder = Path(root) / name / point / "deepspeed"
            universal = engine_folder / "universal"
            assert (universal / "engine").is_dir() and (universal / "latest_universal").is_file()
            assert not list(engine_folder.glob(".universal.accel-tmp-*")), f"{name} {point}"
            # Converted once: a later load on another count reuses the complete conversion.
            identity = (universal.stat().st_ino, universal.stat().st_mtime_ns)
            assert CONVERTED.setdefault(universal, identity) == identity, f"{name} {point}"
    if world_size == 1 and "zero3" in ZERO_NAMES:
        # ZeRO-3's universal load restores Adam's states only: other optimizers, a clear refusal.
        refusal = reports[0]["zero3"]["refusal"]
        assert "ZeRO-3" in refusal and "SGD" in refusal and "load on 2 processes" in refusal
