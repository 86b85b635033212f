"""``torch.distributed.checkpoint`` planners whose planning stays near-linear in the rank count.

DCP's coordinator gathers every rank's local save plan, drops replicated duplicates, numbers the
chunks and validates the layout; torch 2.4 to 2.12 check chunk overlap pairwise (quadratic in the
chunks of a tensor, minutes at a thousand FSDP ranks). :class:`ScalableSavePlanner` builds the same
global plan and metadata with torch's own dedup and metadata helpers and validates in
O(chunks log chunks). Where torch has save-plan caching (``DefaultSavePlanner``'s
``enable_plan_caching``; see :func:`accel_state.torch_compat.dcp_plan_caching`), a repeated save
with an unchanged layout reuses the cached global plan and metadata; older torch plans each save.

:class:`ScalableLoadPlanner` finds the saved chunks that overlap each local chunk by binary search
over their sorted offsets instead of testing every saved chunk, and plans with the current
(torch >= 2.4) key format directly, as accel writes no other.

Example:
    >>> from torch.distributed.checkpoint import load, save
    >>> save(state, checkpoint_id=folder, planner=ScalableSavePlanner(cache_key="model"))  # doctest: +SKIP
    >>> load(state, checkpoint_id=folder, planner=ScalableLoadPlanner())  # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gc
import itertools
import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    DefaultSavePlanner,
    create_default_global_save_plan,
)
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem, SavePlan, SavePlanner
from torch.distributed.checkpoint.planner_helpers import (
    _create_chunk_list,
    _create_read_item_for_tensor,
    _create_read_items,
)
from torch.distributed.checkpoint.resharding import _shards_get_overlap_region_wrt_saved_tensor

from accel_ckpt.errors import (
    CheckpointContentsError,
    InvalidSavePlanError,
    StateDictMismatchError,
)
from accel_state.torch_compat import (
    dcp_checks_cover_of_single_plan,
    dcp_plan_caching,
    dtensor_class,
)

logger = logging.getLogger(__name__)

#: How many layout errors a refused save plan names (the rest are counted).
MAX_REPORTED_ERRORS = 10


# ----------------------------------------------------------------------------- validation
def _boxes_overlap(a: ChunkStorageMetadata, b: ChunkStorageMetadata) -> bool:
    """DCP's overlap test: in every dimension each box starts before the other one ends."""
    return all(
        a_off < b_off + b_len and b_off < a_off + a_len
        for a_off, a_len, b_off, b_len in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)
    )


def _in_bounds(size: Sequence[int], chunk: ChunkStorageMetadata) -> bool:
    return all(
        off >= 0 and length >= 0 and off + length <= whole
        for off, length, whole in zip(chunk.offsets, chunk.sizes, size, strict=False)
    )


def _intervals_disjoint(intervals: Iterable[tuple[int, int]]) -> bool:
    """Whether distinct ``(start, end)`` intervals never overlap (each starts after all earlier)."""
    reach = None
    for start, end in sorted(set(intervals)):
        if reach is not None and start < reach:
            return False
        reach = end if reach is None else max(reach, end)
    return True


def overlapping_chunks(chunks: Sequence[ChunkStorageMetadata]) -> list[tuple[int, int]]:
    """Pairs of chunk indices that overlap, by DCP's test; O(n log n) for grid layouts.

    When, in every dimension, the chunks' intervals are either equal or disjoint (even and
    uneven ``Shard`` placements on any mesh), two chunks overlap only when they are the same
    non-empty box: found by sorting. Other layouts fall back to a sweep line over the longest
    dimension (quadratic only when many chunks span one point of it).
    """
    if len(chunks) < 2:
        return []
    dims = len(chunks[0].offsets)
    if dims == 0:
        return [(0, i) for i in range(1, len(chunks))]
    grid = all(
        _intervals_disjoint((c.offsets[d], c.offsets[d] + c.sizes[d]) for c in chunks)
        for d in range(dims)
    )
    if grid:
        order = sorted(range(len(chunks)), key=lambda i: (chunks[i].offsets, chunks[i].sizes))
        return [
            (first, second)
            for first, second in itertools.pairwise(order)
            if chunks[first].offsets == chunks[second].offsets
            and chunks[first].sizes == chunks[second].sizes
            and all(length > 0 for length in chunks[first].sizes)
        ]
    sweep = max(range(dims), key=lambda d: max(c.offsets[d] + c.sizes[d] for c in chunks))
    order = sorted(range(len(chunks)), key=lambda i: tuple(chunks[i].offsets))
    order.sort(key=lambda i: chunks[i].offsets[sweep])
    active: list[tuple[int, int]] = []
    pairs: list[tuple[int, int]] = []
    for index in order:
        current = chunks[index]
        start = current.offsets[sweep]
        del active[: bisect.bisect_right(active, (start, len(chunks)))]
        pairs += [(other, index) for _, other in active if _boxes_overlap(current, chunks[other])]
        bisect.insort(active, (start + current.sizes[sweep], index))
    return pairs


def layout_errors(metadata: Metadata, check_cover: bool) -> list[str]:
    """What is wrong with the chunk layout of every tensor in ``metadata`` (empty: valid).

    Args:
        metadata: The global metadata of a save.
        check_cover: Also require the chunks' volume to equal the tensor's.
    """
    errors: list[str] = []
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata) or len(entry.size) == 0:
            continue
        chunks = entry.chunks
        errors += [
            f"key:{key} has out of bounds chunk: tensor-size:{entry.size} chunk: {chunk}"
            for chunk in chunks
            if not _in_bounds(entry.size, chunk)
        ]
        errors += [
            f"key:{key} has overlapping chunks: {chunks[a]} {chunks[b]}"
            for a, b in overlapping_chunks(chunks)
        ]
        volume = sum(math.prod(chunk.sizes) for chunk in chunks)
        if check_cover and volume != math.prod(entry.size):
            errors.append(
                f"key:{key} invalid fill tensor-volume: {math.prod(entry.size)} "
                f"chunks-volume: {volume}"
            )
    return errors


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while inside (planning makes no cycles).

    Global planning allocates a few objects per chunk of every process; at thousands of
    processes the collector's full passes over them took more time than the planning itself.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def global_save_plan(
    all_plans: list[SavePlan], flatten_state_dict: bool, dedup_save_to_lowest_rank: bool
) -> tuple[list[SavePlan], Metadata]:
    """The deduplicated global plan and metadata that torch's default planner makes, validated.

    Deduplication, index hints and metadata are torch's own (linear in the items of all plans),
    run with the garbage collector paused; validation is :func:`layout_errors`.

    Raises:
        InvalidSavePlanError: Chunks lie outside their tensor, overlap, or leave part uncovered.
    """
    with collection_paused():
        deduped = dedup_save_plans(all_plans, dedup_save_to_lowest_rank)
        global_plan, metadata = create_default_global_save_plan(deduped)
    if flatten_state_dict:
        # dict(ChainMap(*maps)) as torch merges them: the first plan naming a key wins.
        merged: dict[str, Any] = {}
        for plan in reversed(global_plan):
            merged.update(plan.planner_data)
        metadata = dataclasses.replace(metadata, planner_data=merged)
    check_cover = len(global_plan) > 1 or dcp_checks_cover_of_single_plan()
    errors = layout_errors(metadata, check_cover)
    if errors:
        for error in errors[:MAX_REPORTED_ERRORS]:
            logger.warning(error)
        more = len(errors) - MAX_REPORTED_ERRORS
        summary = "; ".join(errors[:MAX_REPORTED_ERRORS]) + (
            f"; and {more} more" if more > 0 else ""
        )
        raise InvalidSavePlanError(
            f"the processes' save plans do not tile their tensors: {summary}. Every process must "
            "save its own shard of each tensor (the same global shape, disjoint chunks that cover "
            "it); check that all processes pass state dicts sharded the same way."
        )
    return global_plan, metadata


class ScalableSavePlanner(DefaultSavePlanner):
    """``DefaultSavePlanner`` with O(chunks log chunks) global planning and plan caching.

    Args:
        cache_key: Names this state's cached plans (one per model saved repeatedly) where torch
            caches save plans; planners of different states must use different keys.
        enable_plan_caching: Reuse the cached global plan and metadata when no local plan
            changed since the last save with the same ``cache_key`` (torch with
            ``enable_plan_caching`` only; older torch plans each save).
        flatten_state_dict: As torch's ``DefaultSavePlanner``.
        flatten_sharded_tensors: As torch's ``DefaultSavePlanner``.
        dedup_save_to_lowest_rank: As torch's ``DefaultSavePlanner``.
    """

    def __init__(
        self,
        cache_key: str | None = None,
        enable_plan_caching: bool = True,
        flatten_state_dict: bool = True,
        flatten_sharded_tensors: bool = True,
        dedup_save_to_lowest_rank: bool = False,
    ) -> None:
        self.plan_caching = enable_plan_caching and dcp_plan_caching()
        options: dict[str, Any] = {"enable_plan_caching": True} if self.plan_caching else {}
        super().__init__(
            flatten_state_dict=flatten_state_dict,
            flatten_sharded_tensors=flatten_sharded_tensors,
            dedup_save_to_lowest_rank=dedup_save_to_lowest_rank,
            **options,
        )
        self._cached_plans_key = type(self).__name__ + (f":{cache_key}" if cache_key else "")
        #: Whether this process's last save reused the cached plan (set by ``finish_plan``).
        self.reused_cached_plan = False

    def _create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        """Torch's global plan and metadata, validated in O(chunks log chunks)."""
        return global_save_plan(all_plans, self.flatten_state_dict, self.dedup_save_to_lowest_rank)

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        """The coordinator's global plan (cached where torch caches plans)."""
        if self.plan_caching:
            cached = self._cached_plans_key in SavePlanner._cached_all_plans
            result: tuple[list[SavePlan], Metadata] = super().create_global_plan(all_plans)
            if cached and not any(plan.usable for plan in all_plans):
                logger.debug(
                    "no local save plan changed: reusing the cached global plan and metadata "
                    "of %r for %d processes",
                    self._cached_plans_key,
                    len(all_plans),
                )
            return result
        self.global_plan, self.metadata = self._create_global_plan(all_plans)
        return self.global_plan, self.metadata

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        """This process's final plan: the cached one when the coordinator sent none."""
        self.reused_cached_plan = self.plan_caching and not new_plan.usable
        if self.reused_cached_plan:
            logger.debug("reusing the cached save plan of %r", self._cached_plans_key)
        return super().finish_plan(new_plan)  # type: ignore[no-any-return]

    def forget_cached_plans(self) -> None:
        """Drop the plans torch cached under this planner's key (the next save plans afresh).

        torch keeps them on the planner class for the life of the process; a process that will
        not save this state again can free them (the coordinator holds every process's plan).
        """
        for name in (
            "_cached_all_plans",
            "_cached_global_plan",
            "_cached_metadata",
            "_cached_save_plan",
            "_cached_final_save_plan",
        ):
            getattr(SavePlanner, name, {}).pop(self._cached_plans_key, None)


# ----------------------------------------------------------------------------- loading
@dataclasses.dataclass
class SavedChunkIndex:
    """The saved chunks of one tensor sorted by their start along the most divided dimension.

    Attributes:
        dim: The dimension searched (the one with the most distinct chunk starts).
        order: Chunk indices by start along ``dim``.
        starts: Starts along ``dim``, in ``order``.
        ends: Ends along ``dim``, in ``order``.
        monotone: Whether ``ends`` never decrease (then the overlapping chunks are one range).
    """

    dim: int
    order: list[int]
    starts: list[int]
    ends: list[int]
    monotone: bool

    @classmethod
    def build(cls, chunks: Sequence[ChunkStorageMetadata]) -> SavedChunkIndex:
        """Index ``chunks`` (one pass per dimension and one sort, linear when already sorted)."""
        dims = len(chunks[0].offsets) if chunks else 0
        dim = max(range(dims), key=lambda d: len({c.offsets[d] for c in chunks}), default=0)
        if dims == 0:
            return cls(0, list(range(len(chunks))), [], [], False)
        starts = [c.offsets[dim] for c in chunks]
        order = sorted(range(len(chunks)), key=starts.__getitem__)
        ends = [starts[i] + chunks[i].sizes[dim] for i in order]
        monotone = all(a <= b for a, b in itertools.pairwise(ends))
        return cls(dim, order, [starts[i] for i in order], ends, monotone)

    def candidates(self, chunk: ChunkStorageMetadata) -> list[int]:
        """Saved chunks that may overlap ``chunk`` (all that overlap it along ``dim``), sorted."""
        if not self.starts:
            return sorted(self.order)
        start = chunk.offsets[self.dim]
        end = start + chunk.sizes[self.dim]
        high = bisect.bisect_left(self.starts, end)
        if self.monotone:
            return sorted(self.order[bisect.bisect_right(self.ends, start) : high])
        return sorted(self.order[i] for i in range(high) if self.ends[i] > start)


def _overlap_volume(a: ChunkStorageMetadata, b: ChunkStorageMetadata) -> int:
    return math.prod(
        max(0, min(a_off + a_len, b_off + b_len) - max(a_off, b_off))
        for a_off, a_len, b_off, b_len in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)
    )


def covering_chunks(
    chunks: Sequence[ChunkStorageMetadata], local: ChunkStorageMetadata
) -> list[int] | None:
    """The saved chunks overlapping ``local``, by two binary searches; ``None`` when unsure.

    DCP lists a tensor's saved chunks in rank order, which for ``Shard`` placements is sorted
    along one dimension (the first in which the first and last chunks start apart). Bisecting
    that order gives the chunks overlapping ``local`` along it; the answer is kept only when
    their overlaps fill ``local`` exactly, which (saved chunks never overlap: DCP's save
    validation refuses that) proves no other saved chunk touches it. ``None`` otherwise
    (unsorted chunks, gaps, empty or 0-d chunks): the caller searches the sorted index.
    """
    volume = math.prod(local.sizes)
    if volume == 0 or not local.offsets:
        return None
    first, last = chunks[0].offsets, chunks[-1].offsets
    dim = next((d for d in range(len(first)) if first[d] != last[d]), 0)
    start = local.offsets[dim]
    high = bisect.bisect_left(chunks, start + local.sizes[dim], key=lambda c: c.offsets[dim])
    low = bisect.bisect_right(chunks, start, hi=high, key=lambda c: c.offsets[dim] + c.sizes[dim])
    found = [i for i in range(low, high) if _boxes_overlap(local, chunks[i])]
    covered = sum(_overlap_volume(local, chunks[i]) for i in found)
    return found if covered == volume else None


def read_items_for_chunks(
    fqn: str, saved: TensorStorageMetadata, local_chunks: Sequence[ChunkStorageMetadata]
) -> list[ReadItem]:
    """The reads that fill ``local_chunks`` of tensor ``fqn`` from its saved chunks.

    The same read items as torch's ``create_read_items_for_chunk_list``, by local chunk then
    saved chunk index. The saved chunks overlapping each local one are found by binary search
    (:func:`covering_chunks`: O(log saved chunks)); when that cannot prove its answer, by a
    :class:`SavedChunkIndex` built once per tensor (O(saved chunks)).
    """
    if not local_chunks or not saved.chunks:
        return []
    index: SavedChunkIndex | None = None
    items: list[ReadItem] = []
    for local_index, local in enumerate(local_chunks):
        found = covering_chunks(saved.chunks, local)
        if found is None:
            index = index if index is not None else SavedChunkIndex.build(saved.chunks)
            found = [i for i in index.candidates(local) if _boxes_overlap(local, saved.chunks[i])]
        for storage_index in found:
            stored = saved.chunks[storage_index]
            regions = _shards_get_overlap_region_wrt_saved_tensor(
                saved_shard=stored, current_shard=local
            )
            items.append(
                _create_read_item_for_tensor(
                    dest_index=MetadataIndex(fqn, local.offsets, local_index),
                    dest_offsets=[region[2] for region in regions],
                    storage_index=MetadataIndex(fqn, stored.offsets, storage_index),
                    storage_offsets=[region[1] for region in regions],
                    lengths=[region[3] for region in regions],
                )
            )
    return items


def local_load_plan(state_dict: Mapping[str, Any], metadata: Metadata, strict: bool) -> LoadPlan:
    """This process's load plan: torch's ``create_default_local_load_plan``, searched by bisect.

    Args:
        state_dict: The flattened state to fill.
        metadata: The checkpoint's metadata.
        strict: Refuse keys of ``state_dict`` that the checkpoint lacks (else skip them).

    Raises:
        StateDictMismatchError: A key is missing from the checkpoint, or a tensor's saved global
            shape differs from the one being loaded into.
    """
    dtensor = dtensor_class()
    requests: list[ReadItem] = []
    for fqn, obj in state_dict.items():
        entry = metadata.state_dict_metadata.get(fqn)
        if entry is None:
            if strict:
                raise StateDictMismatchError(
                    f"Missing key in checkpoint state_dict: {fqn}. Load into a state with the "
                    "keys that were saved, or pass allow_partial_load=True to skip it.",
                    missing_keys=[fqn],
                )
            continue
        if (
            dtensor is not None
            and isinstance(obj, dtensor)
            and obj.device_mesh.get_coordinate() is None  # type: ignore[attr-defined]
        ):
            continue  # not on this process's part of the DTensor's mesh
        if isinstance(entry, BytesStorageMetadata):
            requests += _create_read_items(fqn, entry, obj)
            continue
        size = getattr(obj, "size", None)
        if callable(size) and isinstance(obj, torch.Tensor) and entry.size != obj.size():
            raise StateDictMismatchError(
                f"Size mismatch between saved {entry.size} and current: {obj.size()} for {fqn}; "
                "load into a model of the shape that was saved."
            )
        try:
            local_chunks = _create_chunk_list(obj)
        except ValueError as error:
            raise CheckpointContentsError(
                f"Invalid checkpoint metadata for {fqn}, expected BytesStorageMetadata but found "
                f"{type(entry)}"
            ) from error
        requests += read_items_for_chunks(fqn, entry, local_chunks)
    return LoadPlan(requests)


class ScalableLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose local plan bisects the saved chunks; current key format only.

    torch's default planner guesses that a checkpoint predates torch 2.4 when this process asks
    for fewer keys than it holds, and then switches to the old key format. An FSDP1 process that
    holds no element of some parameter (more processes than the flat parameter splits into
    evenly, e.g. resuming on 3 what 2 saved) asks for fewer keys, so the guess sends it looking
    for ``optimizer.param_groups`` and the load fails. accel writes the current format only:
    this planner plans with it directly (and still refuses keys the checkpoint lacks unless
    ``allow_partial_load``).
    """

    def create_local_plan(self) -> LoadPlan:
        """The reads of this process, found in O(tensors x log(saved chunks)) searches."""
        if self.metadata is None:
            raise AssertionError("set_up_planner() gives the planner the metadata first")
        return local_load_plan(self.state_dict, self.metadata, not self.allow_partial_load)


__all__ = [
    "InvalidSavePlanError",
    "SavedChunkIndex",
    "collection_paused",
    "ScalableLoadPlanner",
    "ScalableSavePlanner",
    "global_save_plan",
    "layout_errors",
    "local_load_plan",
    "overlapping_chunks",
    "covering_chunks",
    "read_items_for_chunks",
]
