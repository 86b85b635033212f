"""Checks on what ``ft_everyday.py`` leaves in ``--out``, shared by the replica-group tests.

Used by the tests that run the everyday loop as replica groups on separate machines (test hosts,
a SLURM cluster): each group's step records and each process's final state.
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


def bit_equal(first: Any, second: Any) -> bool:
    """Whether two nested states hold identical tensors and values."""
    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and torch.equal(first, second)
    if isinstance(first, dict):
        return first.keys() == second.keys() and all(bit_equal(first[k], second[k]) for k in first)
    if isinstance(first, (list, tuple)):
        return len(first) == len(second) and all(map(bit_equal, first, second))
    return bool(first == second)


def assert_replicas_bit_equal(out: Path, per_host: int) -> None:
    """Rank r of both groups ends with the same model, optimizer and scheduler state."""
    states = {p.name: torch.load(p, weights_only=False) for p in out.glob("final-*.pt")}
    assert len(states) == 2 * per_host, sorted(states)
    for name, state in states.items():
        # A prepared scheduler moves once per process of the group per committed step.
        assert state["scheduler"]["last_epoch"] == state["committed_steps"] * per_host, name
    for rank in range(per_host):
        assert bit_equal(states[f"final-r0-p{rank}.pt"], states[f"final-r1-p{rank}.pt"]), rank


def assert_each_sample_once(out: Path, epochs: int, samples: int) -> None:
    """The committed steps of each epoch (all records pooled) tile ``0..samples`` exactly."""
    committed: dict[tuple[int, int], set[int]] = {}
    for path in out.glob("steps-*.jsonl"):
        for record in map(json.loads, path.read_text().splitlines()):
            if record["committed"]:
                committed.setdefault((record["epoch"], record["first"]), set()).add(record["count"])
    assert {epoch for epoch, _ in committed} == set(range(epochs)), sorted(committed)
    for epoch in range(epochs):
        position = 0
        for first in sorted(first for at, first in committed if at == epoch):
            counts = committed[(epoch, first)]
            assert len(counts) == 1, f"epoch {epoch} at {first}: steps of sizes {counts}"
            assert first == position, f"epoch {epoch}: samples {position}..{first} lost or reused"
            position += counts.pop()
        assert position == samples, f"epoch {epoch} ended at {position} of {samples}"
