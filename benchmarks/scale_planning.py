"""DCP save/load planning at scale: torch's default planners against accel's, in one process.

An FSDP2-style state (``--tensors`` tensors, default 1,024, each ``Shard(0)`` over N ranks) is
planned for simulated N = 8, 64, 512 and 2,048 ranks. Every simulated rank's local save plan is
built exactly as that rank's ``create_local_plan`` would build it (``tests`` prove it at N=8
against real DTensors on torch's fake process group). Measured:

- coordinator global save planning (``create_global_plan`` over all N local plans): torch's
  ``DefaultSavePlanner``, accel's ``ScalableSavePlanner`` on a first save, and on a repeated save
  with an unchanged layout (every rank then sends an empty, unusable plan where torch caches
  plans; elsewhere a repeated save plans again);
- per-rank local load planning (the reads of one rank from a checkpoint saved by N ranks):
  torch's per-tensor ``create_read_items_for_chunk_list`` (what ``DefaultLoadPlanner`` runs)
  against accel's bisecting ``read_items_for_chunks``, for ranks 0, N/2 and N-1; the slowest
  of them is reported (it bounds the collective load).

The planners' repetitions alternate; medians of ``--repeats`` rounds.

Run: ``python benchmarks/scale_planning.py [--ranks 8 64 512 2048] [--tensors 1024]
[--repeats 3] [--baseline-max-ranks N]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    ReadItem,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from accel_ckpt.dcp_planning import ScalableSavePlanner, read_items_for_chunks
from accel_state.torch_compat import dcp_plan_caching

RANKS = (8, 64, 512, 2048)
TENSORS = 1024
ROWS_PER_WEIGHT = 4096  # divisible by every simulated rank count: even Shard(0) chunks
HIDDEN = 64
MODEL_KEY = "model"


def tensor_shapes(tensors: int) -> dict[str, torch.Size]:
    """The state's tensor names and global shapes: alternating weights and biases."""
    shapes: dict[str, torch.Size] = {}
    for i in range(tensors):
        layer, kind = divmod(i, 2)
        shape = (ROWS_PER_WEIGHT, HIDDEN) if kind == 0 else (ROWS_PER_WEIGHT,)
        shapes[f"layers.{layer}.{'weight' if kind == 0 else 'bias'}"] = torch.Size(shape)
    return shapes


def shard0_chunk(shape: torch.Size, ranks: int, rank: int) -> ChunkStorageMetadata:
    """The chunk of ``rank`` of a ``Shard(0)`` DTensor over ``ranks`` (``torch.chunk`` split)."""
    rows = shape[0]
    per_rank = -(-rows // ranks)
    start = min(rows, rank * per_rank)
    stop = min(rows, start + per_rank)
    return ChunkStorageMetadata(
        offsets=torch.Size([start, *([0] * (len(shape) - 1))]),
        sizes=torch.Size([stop - start, *shape[1:]]),
    )


def flat_name(name: str) -> str:
    """The key DCP's ``flatten_state_dict`` gives ``state[MODEL_KEY][name]``."""
    return f"{MODEL_KEY}.{name}"


def local_save_plan(
    rank: int, ranks: int, shapes: dict[str, torch.Size], properties: TensorProperties
) -> SavePlan:
    """The local save plan of ``rank``: one shard write item per tensor, with its mappings."""
    items = []
    for name, shape in shapes.items():
        chunk = shard0_chunk(shape, ranks, rank)
        items.append(
            WriteItem(
                index=MetadataIndex(flat_name(name), chunk.offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(chunk=chunk, properties=properties, size=shape),
            )
        )
    mappings = {flat_name(name): (MODEL_KEY, name) for name in shapes}
    return SavePlan(items, planner_data=mappings)


def local_save_plans(ranks: int, tensors: int = TENSORS) -> list[SavePlan]:
    """Every simulated rank's local save plan (float32 CPU shards)."""
    shapes = tensor_shapes(tensors)
    properties = TensorProperties.create_from_tensor(torch.empty(0))
    return [local_save_plan(rank, ranks, shapes, properties) for rank in range(ranks)]


def local_chunks(rank: int, ranks: int, tensors: int = TENSORS) -> dict[str, ChunkStorageMetadata]:
    """The chunk ``rank`` loads of each tensor (by flattened key), resharded onto ``ranks``."""
    return {
        flat_name(name): shard0_chunk(shape, ranks, rank)
        for name, shape in tensor_shapes(tensors).items()
    }


def torch_read_items(metadata: Metadata, chunks: dict[str, ChunkStorageMetadata]) -> list[ReadItem]:
    """One rank's reads as torch's ``DefaultLoadPlanner`` finds them."""
    items: list[ReadItem] = []
    for fqn, chunk in chunks.items():
        entry = metadata.state_dict_metadata[fqn]
        assert isinstance(entry, TensorStorageMetadata)
        items += create_read_items_for_chunk_list(fqn, entry, [chunk])
    return items


def accel_read_items(metadata: Metadata, chunks: dict[str, ChunkStorageMetadata]) -> list[ReadItem]:
    """One rank's reads as accel's ``ScalableLoadPlanner`` finds them."""
    items: list[ReadItem] = []
    for fqn, chunk in chunks.items():
        entry = metadata.state_dict_metadata[fqn]
        assert isinstance(entry, TensorStorageMetadata)
        items += read_items_for_chunks(fqn, entry, [chunk])
    return items


def _seconds(work: Callable[[], Any]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def _save_round(
    plans: list[SavePlan], key: str, baseline: bool
) -> tuple[dict[str, float], Metadata]:
    """One round of the coordinator's measurements, the planners alternating; the metadata."""
    result: dict[str, float] = {}
    if baseline:
        result["torch_save"] = _seconds(
            lambda: DefaultSavePlanner().create_global_plan(list(plans))
        )
    first = ScalableSavePlanner(cache_key=key)
    first.forget_cached_plans()
    result["accel_save"] = _seconds(lambda: first.create_global_plan(list(plans)))
    again = ScalableSavePlanner(cache_key=key)
    # Where torch caches plans, every rank whose local plan is unchanged sends an empty one.
    resave = [SavePlan([], usable=False) for _ in plans] if dcp_plan_caching() else list(plans)
    result["accel_resave"] = _seconds(lambda: again.create_global_plan(resave))
    first.forget_cached_plans()
    return result, first.metadata


def _load_round(
    metadata: Metadata, chunks: list[dict[str, ChunkStorageMetadata]], baseline: bool
) -> dict[str, float]:
    """One round of the per-rank measurements (the slowest sampled rank), alternating."""
    result: dict[str, float] = {}
    if baseline:
        result["torch_load"] = max(_seconds(partial(torch_read_items, metadata, c)) for c in chunks)
    result["accel_load"] = max(_seconds(partial(accel_read_items, metadata, c)) for c in chunks)
    return result


def measure(ranks: int, tensors: int, repeats: int, baseline: bool) -> dict[str, Any]:
    """Median seconds of each planning step for ``ranks`` simulated ranks (see module doc).

    The load rounds run after the save rounds, with only the metadata alive (as on a rank).
    """
    plans = local_save_plans(ranks, tensors)
    key = f"bench-{uuid.uuid4().hex}"
    timings: dict[str, list[float]] = {
        "torch_save": [],
        "accel_save": [],
        "accel_resave": [],
        "torch_load": [],
        "accel_load": [],
    }
    for _ in range(repeats):
        result, metadata = _save_round(plans, key, baseline)
        for name, seconds in result.items():
            timings[name].append(seconds)
    del plans
    gc.collect()
    sampled = sorted({0, ranks // 2, ranks - 1})
    chunks = [local_chunks(rank, ranks, tensors) for rank in sampled]
    for _ in range(repeats):
        for name, seconds in _load_round(metadata, chunks, baseline).items():
            timings[name].append(seconds)
    row: dict[str, Any] = {"ranks": ranks, "tensors": tensors, "repeats": repeats}
    for name, values in timings.items():
        row[name] = statistics.median(values) if values else None
    return row


def rows(
    ranks: Sequence[int] = RANKS,
    tensors: int = TENSORS,
    repeats: int = 3,
    baseline_max_ranks: int | None = None,
) -> list[dict[str, Any]]:
    """One row of median seconds per rank count (``None``: baseline not measured)."""
    return [
        measure(n, tensors, repeats, baseline_max_ranks is None or n <= baseline_max_ranks)
        for n in ranks
    ]


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or denominator is None or denominator <= 0:
        return "-"
    return f"{numerator / denominator:.1f}x"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def table(results: Sequence[dict[str, Any]]) -> str:
    """The rows as a text table with the speed-ups of accel's planners over torch's."""
    head = (
        f"{'ranks':>6} {'torch save s':>13} {'accel save s':>13} {'x':>7} "
        f"{'accel resave s':>15} {'x':>8} {'torch load s/rank':>18} {'accel load s/rank':>18} "
        f"{'x':>7}"
    )
    lines = [head]
    for row in results:
        lines.append(
            f"{row['ranks']:>6} {_secs(row['torch_save']):>13} {_secs(row['accel_save']):>13} "
            f"{_ratio(row['torch_save'], row['accel_save']):>7} "
            f"{_secs(row['accel_resave']):>15} {_ratio(row['torch_save'], row['accel_resave']):>8} "
            f"{_secs(row['torch_load']):>18} {_secs(row['accel_load']):>18} "
            f"{_ratio(row['torch_load'], row['accel_load']):>7}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=list(RANKS))
    parser.add_argument("--tensors", type=int, default=TENSORS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--baseline-max-ranks",
        type=int,
        default=None,
        help="measure torch's planners only up to this many ranks (torch < 2.13 is quadratic)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.tensors < 1 or min(args.ranks) < 1:
        parser.error(
            f"--repeats={args.repeats}, --tensors={args.tensors} and --ranks={args.ranks} must "
            "all be at least 1"
        )
    print(
        f"torch {torch.__version__}: {args.tensors} tensors, Shard(0); medians of "
        f"{args.repeats} alternated rounds; plan caching: {dcp_plan_caching()}"
    )
    results = rows(args.ranks, args.tensors, args.repeats, args.baseline_max_ranks)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "accel_read_items",
    "local_chunks",
    "local_save_plans",
    "main",
    "measure",
    "rows",
    "table",
    "torch_read_items",
]
