"""accel's DCP planners against torch's defaults: same plans, metadata, reads and refusals."""

from __future__ import annotations

import itertools
import logging
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import default_planner
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from accel_ckpt.dcp_planning import (
    InvalidSavePlanError,
    ScalableLoadPlanner,
    ScalableSavePlanner,
    layout_errors,
)
from accel_ckpt.errors import StateDictMismatchError
from accel_state.testing import spawn_workers
from accel_state.torch_compat import dcp_plan_caching

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
except ImportError:  # torch 2.4
    from torch.distributed._tensor import (  # type: ignore[no-redef]
        DTensor,
        Replicate,
        Shard,
        distribute_tensor,
    )

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"

StateBuilder = Callable[[Any], dict[str, Any]]


# ----------------------------------------------------------------------------- helpers
@pytest.fixture
def fake_ranks() -> Iterator[Callable[[int], Any]]:
    """``enter(rank, world)``: join torch's fake process group as ``rank`` (left afterwards)."""

    def enter(rank: int, world: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)

    yield enter  # type: ignore[misc]
    if dist.is_initialized():
        dist.destroy_process_group()


def save_plans(
    enter: Callable[..., None], world: int, mesh_shape: tuple[int, ...], build: StateBuilder
) -> list[SavePlan]:
    """Every rank's local plan, as torch's DefaultSavePlanner builds it on that rank."""
    plans = []
    for rank in range(world):
        enter(rank, world)
        planner = DefaultSavePlanner()
        planner.set_up_planner(
            state_dict=build(init_device_mesh("cpu", mesh_shape)), is_coordinator=rank == 0
        )
        plans.append(planner.create_local_plan())
    return plans


def mixed_state(mesh: Any) -> dict[str, Any]:
    """Uneven, replicated, plain, bytes and (on 2-D meshes) 2-D sharded items."""
    torch.manual_seed(0)
    one_d = mesh.ndim == 1
    model: dict[str, Any] = {
        "w": distribute_tensor(torch.randn(11, 6), mesh, [Shard(0)] * mesh.ndim),
        "b": distribute_tensor(torch.randn(7), mesh, [Replicate()] * mesh.ndim),
        "plain": torch.arange(5.0),
    }
    if not one_d:
        model["grid"] = distribute_tensor(torch.randn(10, 9), mesh, [Shard(0), Shard(1)])
        model["flipped"] = distribute_tensor(torch.randn(9, 10), mesh, [Shard(1), Shard(0)])
        model["half"] = distribute_tensor(torch.randn(13, 3), mesh, [Replicate(), Shard(0)])
    return {"model": model, "step": 7, "extra": {"lr": 0.5, "names": ["a", "b"]}}


LAYOUTS = [(1, (1,)), (2, (2,)), (5, (5,)), (8, (8,)), (4, (2, 2)), (6, (2, 3)), (8, (4, 2))]


def write_item(fqn: str, offsets: list[int], sizes: list[int], size: list[int]) -> WriteItem:
    chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
    return WriteItem(
        index=MetadataIndex(fqn, chunk.offsets),
        type=WriteItemType.SHARD,
        tensor_data=TensorWriteData(
            chunk=chunk, properties=TensorProperties(dtype=torch.float32), size=torch.Size(size)
        ),
    )


def torch_refuses(plans: list[SavePlan]) -> bool:
    try:
        DefaultSavePlanner(flatten_state_dict=False).create_global_plan(list(plans))
    except ValueError:
        return True
    return False


def forget(planner: ScalableSavePlanner) -> None:
    planner.forget_cached_plans()


# ----------------------------------------------------------------------------- save
@pytest.mark.parametrize(("world", "mesh_shape"), LAYOUTS)
def test_global_plan_and_metadata_equal_torchs(fake_ranks, world, mesh_shape):
    plans = save_plans(fake_ranks, world, mesh_shape, mixed_state)
    expected = DefaultSavePlanner().create_global_plan(list(plans))
    got = ScalableSavePlanner(enable_plan_caching=False).create_global_plan(list(plans))
    assert got[0] == expected[0]
    assert got[1] == expected[1]
    deduped = sum(len(plan.items) for plan in got[0])
    assert deduped < sum(len(plan.items) for plan in plans) or world == 1


@pytest.mark.parametrize(
    ("items", "what"),
    [
        ([[([0], [6])], [([4], [6])]], "overlapping"),
        ([[([0], [4])], [([6], [4])]], "invalid fill"),
        ([[([0], [6])], [([6], [6])]], "out of bounds"),
        ([[([0, 0], [3, 3])], [([1, 1], [3, 3]), ([0, 3], [1, 1])]], "overlapping"),
    ],
)
def test_bad_layouts_are_refused_like_torch_refuses_them(items, what):
    size = [10] if len(items[0][0][0]) == 1 else [4, 4]
    plans = [SavePlan([write_item("t", o, s, size) for o, s in rank]) for rank in items]
    assert torch_refuses(plans)
    with pytest.raises(InvalidSavePlanError, match=what) as caught:
        ScalableSavePlanner(enable_plan_caching=False, flatten_state_dict=False).create_global_plan(
            list(plans)
        )
    assert isinstance(caught.value, ValueError) and "key:t" in str(caught.value)


def random_chunks(rng: random.Random, size: torch.Size) -> list[ChunkStorageMetadata]:
    """Arbitrary boxes, or a grid tiling (empty intervals included), maybe with one box moved."""
    if rng.random() < 0.4:
        chunks = []
        for _ in range(rng.randint(1, 6)):
            offsets = [rng.randint(0, extent) for extent in size]
            sizes = [
                rng.randint(0, extent - o + 1) for o, extent in zip(offsets, size, strict=True)
            ]
            chunks.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
        return chunks
    cuts = [sorted({0, extent, *(rng.randint(0, extent) for _ in range(3))}) for extent in size]
    if rng.random() < 0.3:  # an empty interval at a cut
        cuts[0].insert(1, cuts[0][1])
    boxes: list[list[tuple[int, int]]] = [[]]
    for dim_cuts in cuts:
        spans = list(itertools.pairwise(dim_cuts))
        boxes = [[*box, span] for box in boxes for span in spans]
    chunks = [
        ChunkStorageMetadata(torch.Size([a for a, _ in box]), torch.Size([b - a for a, b in box]))
        for box in boxes
    ]
    if rng.random() < 0.5:
        moved = rng.randrange(len(chunks))
        offsets = list(chunks[moved].offsets)
        offsets[rng.randrange(len(offsets))] += rng.choice([-1, 1])
        chunks[moved] = ChunkStorageMetadata(torch.Size(offsets), chunks[moved].sizes)
    return chunks


def test_validation_decides_like_torch_on_random_layouts():
    rng = random.Random(4)
    refused = 0
    for _ in range(600):
        size = torch.Size([rng.randint(1, 6) for _ in range(rng.choice([1, 2, 3]))])
        chunks = random_chunks(rng, size)
        entry = TensorStorageMetadata(TensorProperties(dtype=torch.float32), size, chunks)
        metadata = Metadata({"t": entry})
        answer = default_planner._validate_global_plan([SavePlan([]), SavePlan([])], metadata)
        torch_refused = answer is False or (isinstance(answer, list) and bool(answer))
        assert bool(layout_errors(metadata, check_cover=True)) == torch_refused, chunks
        refused += torch_refused
    assert 100 < refused < 500  # both outcomes were exercised


def test_grid_layout_of_many_chunks_validates(fake_ranks):
    chunks = [
        ChunkStorageMetadata(torch.Size([i * 2, j * 3]), torch.Size([2, 3]))
        for i in range(64)
        for j in range(32)
    ]
    entry = TensorStorageMetadata(
        TensorProperties(dtype=torch.float32), torch.Size([128, 96]), chunks
    )
    assert layout_errors(Metadata({"t": entry}), check_cover=True) == []
    chunks[5] = ChunkStorageMetadata(torch.Size([0, 1]), torch.Size([2, 3]))
    assert any("overlapping" in e for e in layout_errors(Metadata({"t": entry}), check_cover=True))


@pytest.mark.skipif(not dcp_plan_caching(), reason="this torch has no save-plan caching")
def test_a_repeated_save_reuses_the_cached_plan_and_a_new_layout_replaces_it(fake_ranks, caplog):
    plans = save_plans(fake_ranks, 4, (2, 2), mixed_state)
    first = ScalableSavePlanner(cache_key="reuse-test")
    forget(first)
    try:
        _, metadata = first.create_global_plan(list(plans))
        with caplog.at_level(logging.DEBUG, logger="accel_ckpt.dcp_planning"):
            unchanged = [SavePlan([], usable=False) for _ in plans]
            delta, again = ScalableSavePlanner(cache_key="reuse-test").create_global_plan(unchanged)
        assert again is metadata and all(not plan.usable for plan in delta)
        assert any("reusing the cached global plan" in r.getMessage() for r in caplog.records)

        caplog.clear()
        changed = list(unchanged)
        changed[1] = SavePlan(  # rank 1 now also saves a tensor of its own
            [*plans[1].items, write_item("other", [0], [4], [4])],
            planner_data={**plans[1].planner_data, "other": ("other",)},
        )
        with caplog.at_level(logging.DEBUG, logger="accel_ckpt.dcp_planning"):
            _, renewed = ScalableSavePlanner(cache_key="reuse-test").create_global_plan(changed)
        assert "other" in renewed.state_dict_metadata and renewed is not metadata
        assert not any("reusing" in r.getMessage() for r in caplog.records)
        expected = DefaultSavePlanner().create_global_plan(
            [plans[0], changed[1], plans[2], plans[3]]
        )[1]
        assert renewed == expected
    finally:
        forget(first)


def test_without_caching_every_save_plans_again(fake_ranks):
    plans = save_plans(fake_ranks, 2, (2,), mixed_state)
    planner = ScalableSavePlanner(enable_plan_caching=False)
    assert not planner.plan_caching
    first = planner.create_global_plan(list(plans))
    second = ScalableSavePlanner(enable_plan_caching=False).create_global_plan(list(plans))
    assert first[1] == second[1] and first[1] is not second[1]


# ----------------------------------------------------------------------------- load
def sorted_items(items: list[Any]) -> list[Any]:
    return sorted(
        items,
        key=lambda i: (i.dest_index.fqn, i.dest_index.index or 0, i.storage_index.index or 0),
    )


def load_plans(
    enter: Callable[..., None],
    world: int,
    mesh_shape: tuple[int, ...],
    build: StateBuilder,
    metadata: Metadata,
    planner_type: type,
) -> list[list[Any]]:
    plans = []
    for rank in range(world):
        enter(rank, world)
        planner = planner_type()
        planner.set_up_planner(build(init_device_mesh("cpu", mesh_shape)), metadata, rank == 0)
        plans.append(planner.create_local_plan().items)
    return plans


def resharded_state(mesh: Any) -> dict[str, Any]:
    """The keys of mixed_state on 2-D meshes, placed differently."""
    one_d = mesh.ndim == 1
    shard0 = [Shard(0)] * mesh.ndim
    model: dict[str, Any] = {
        "w": distribute_tensor(torch.zeros(11, 6), mesh, [Shard(1)] * mesh.ndim),
        "b": distribute_tensor(torch.zeros(7), mesh, shard0),
        "plain": torch.zeros(5),
        "grid": distribute_tensor(
            torch.zeros(10, 9), mesh, shard0 if one_d else [Shard(1), Shard(0)]
        ),
        "flipped": distribute_tensor(torch.zeros(9, 10), mesh, shard0),
        "half": distribute_tensor(torch.zeros(13, 3), mesh, [Replicate()] * mesh.ndim),
    }
    return {"model": model, "step": 0, "extra": {"lr": 0.0, "names": ["", ""]}}


@pytest.mark.parametrize(
    ("world", "mesh_shape"), [(1, (1,)), (3, (3,)), (4, (2, 2)), (8, (8,)), (6, (3, 2))]
)
def test_load_plans_equal_torchs_when_resharding(fake_ranks, world, mesh_shape):
    saved = save_plans(fake_ranks, 6, (2, 3), mixed_state)
    _, metadata = DefaultSavePlanner().create_global_plan(list(saved))
    expected = load_plans(
        fake_ranks, world, mesh_shape, resharded_state, metadata, DefaultLoadPlanner
    )
    got = load_plans(fake_ranks, world, mesh_shape, resharded_state, metadata, ScalableLoadPlanner)
    assert [sorted_items(p) for p in got] == [sorted_items(p) for p in expected]
    assert sum(len(p) for p in got) > 6 * world


def test_load_refuses_unknown_keys_unless_partial_and_ignores_unrequested_ones(fake_ranks):
    saved = save_plans(fake_ranks, 2, (2,), mixed_state)
    _, metadata = DefaultSavePlanner().create_global_plan(list(saved))
    fake_ranks(0, 2)
    mesh = init_device_mesh("cpu", (2,))
    fewer = {"model": {"w": distribute_tensor(torch.zeros(11, 6), mesh, [Shard(0)])}}
    planner = ScalableLoadPlanner()
    planner.set_up_planner(fewer, metadata, True)
    assert {item.dest_index.fqn for item in planner.create_local_plan().items} == {"model.w"}
    more = {"model": {"w": torch.zeros(11, 6), "new": torch.zeros(2)}}
    planner = ScalableLoadPlanner()
    planner.set_up_planner(more, metadata, True)
    with pytest.raises(StateDictMismatchError, match=r"model\.new"):
        planner.create_local_plan()
    partial = ScalableLoadPlanner(allow_partial_load=True)
    partial.set_up_planner(more, metadata, True)
    assert {i.dest_index.fqn for i in partial.create_local_plan().items} == {"model.w"}
    wrong = ScalableLoadPlanner()
    wrong.set_up_planner({"model": {"w": torch.zeros(12, 6)}}, metadata, True)
    with pytest.raises(StateDictMismatchError, match="Size mismatch"):
        wrong.create_local_plan()


# ----------------------------------------------------------------------------- benchmark model
def test_the_benchmarks_simulated_plans_are_the_ranks_own(fake_ranks, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import scale_planning as bench

    world, tensors = 8, 12
    shapes = bench.tensor_shapes(tensors)
    simulated = bench.local_save_plans(world, tensors)

    def meta_state(mesh: Any) -> dict[str, Any]:
        rank = dist.get_rank()
        model = {}
        for name, shape in shapes.items():
            chunk = bench.shard0_chunk(shape, world, rank)
            local = torch.empty(chunk.sizes, device="meta")
            model[name] = DTensor.from_local(
                local,
                mesh,
                [Shard(0)],
                run_check=False,
                shape=shape,
                stride=torch.empty(shape, device="meta").stride(),
            )
        return {bench.MODEL_KEY: model}

    real = save_plans(fake_ranks, world, (world,), meta_state)
    assert real == simulated
    _, metadata = DefaultSavePlanner().create_global_plan(list(real))
    torch_reads = load_plans(fake_ranks, world, (world,), meta_state, metadata, DefaultLoadPlanner)
    accel_reads = load_plans(fake_ranks, world, (world,), meta_state, metadata, ScalableLoadPlanner)
    for rank in range(world):
        chunks = bench.local_chunks(rank, world, tensors)
        assert bench.torch_read_items(metadata, chunks) == torch_reads[rank]
        assert bench.accel_read_items(metadata, chunks) == accel_reads[rank] == torch_reads[rank]
    rows = bench.rows(ranks=(4,), tensors=4, repeats=1)
    assert rows[0]["ranks"] == 4 and rows[0]["accel_save"] > 0 and rows[0]["torch_load"] > 0
    assert sys.modules["scale_planning"] is bench


# ----------------------------------------------------------------------------- two processes
def test_two_processes_save_twice_reuse_the_plan_and_reload_resharded(tmp_path):
    from dcp_planning_workers import saves_twice_and_reloads

    results = spawn_workers(saves_twice_and_reloads, 2, args=(str(tmp_path),), timeout=180)
    caching = dcp_plan_caching()
    for result in results:
        assert result["reused"] == [False, caching]
        assert any("reusing the cached save plan" in m for m in result["logs"]) == caching
        assert result["same_metadata"]
        assert result["bits_equal"] == {"w": True, "b": True, "r": True}
        assert result["step"] == 3
    coordinator = next(r for r in results if r["rank"] == 0)
    assert any("reusing the cached global plan" in m for m in coordinator["logs"]) == caching
