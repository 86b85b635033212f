"""Checks on what ``ft_everyday.py`` leaves in ``--out``, shared by the replica-group tests.

Used by the tests that run the everyday loop as replica groups (on loopback, on test hosts, on a
SLURM cluster): each group's step records and each process's final state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

#: The worker: the everyday loop under replica groups.
WORKER = Path(__file__).resolve().parent / "ft_everyday.py"


def records(out: Path, replica: int, rank: int = 0) -> list[dict[str, Any]]:
    """One process's step records, in order (none yet: empty)."""
    path = out / f"steps-r{replica}-p{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def finals(out: Path) -> dict[str, dict[str, Any]]:
    """Each process's final model/optimizer/scheduler state, by file name."""
    return {
        path.name: torch.load(path, weights_only=False) for path in sorted(out.glob("final-*.pt"))
    }


def bit_equal(first: Any, second: Any) -> bool:
    """Whether two nested states hold identical tensors and values."""
    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and torch.equal(first, second)
    if isinstance(first, dict):
        return first.keys() == second.keys() and all(bit_equal(first[k], second[k]) for k in first)
    if isinstance(first, (list, tuple)):
        return len(first) == len(second) and all(map(bit_equal, first, second))
    return bool(first == second)


def assert_replicas_bit_equal(
    out: Path, replicas: int, processes: int, steps_before_launch: int = 0
) -> None:
    """Rank r of every group ends with the same state (its shard, under FSDP2).

    The scheduler moved on committed steps only (of this launch, after those it resumed from).
    """
    states = finals(out)
    assert len(states) == replicas * processes, sorted(states)
    for name, state in states.items():
        # A prepared scheduler steps once per process of the group per step (Accelerate's rule).
        moves = state["scheduler"]["last_epoch"] - steps_before_launch
        assert moves == state["committed_steps"] * processes, name
    for rank in range(processes):
        reference = states[f"final-r0-p{rank}.pt"]
        for replica in range(1, replicas):
            other = states[f"final-r{replica}-p{rank}.pt"]
            assert bit_equal(reference, other), f"replica {replica} rank {rank} differs"


def assert_each_epoch_used_once(out: Path, epochs: range, samples: int) -> None:
    """The committed steps of each epoch (all records pooled) tile ``0..samples`` exactly."""
    committed: dict[tuple[int, int], set[int]] = {}
    for path in out.glob("steps-*.jsonl"):
        for record in map(json.loads, path.read_text().splitlines()):
            if record["committed"]:
                committed.setdefault((record["epoch"], record["first"]), set()).add(record["count"])
    assert {epoch for epoch, _ in committed} == set(epochs), sorted(committed)
    for epoch in epochs:
        position = 0
        for first in sorted(first for at_epoch, first in committed if at_epoch == epoch):
            counts = committed[(epoch, first)]
            assert len(counts) == 1, f"epoch {epoch} at {first}: steps of sizes {counts}"
            assert first == position, f"epoch {epoch}: samples {position}..{first} lost or reused"
            position += counts.pop()
        assert position == samples, f"epoch {epoch} ended at {position} of {samples}"
