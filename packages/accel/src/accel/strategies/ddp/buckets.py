"""DDP's gradient buckets, kept the same across a resume so it is exact on any number of ranks.

DDP sums gradients in flat buckets. It starts with one bucket per dtype and device and, after
the first step that synchronizes gradients, rebuilds them in the order the gradients became
ready. A ring all-reduce on 3 or more ranks adds each element in an order that depends on its
offset in the bucket, so a run resumed mid-training, whose first step is in the initial layout
where the uninterrupted run was in the rebuilt one, drifted in the last bits.

:class:`SteadyBuckets` is the DDP communication hook that fixes it. It sums exactly as DDP's
built-in path does (scale by ``1 / world size``, then a sum over the group). The checkpoint
records the layout in use (:meth:`SteadyBuckets.layout`); in the resumed run, the hook sums the first
step in that recorded layout, and DDP itself rebuilds the same layout after that step.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # what dist.GradBucket names
from torch.nn.parallel import DistributedDataParallel

#: A bucket layout: each bucket's parameter names, in the order they sit in its flat buffer.
Layout = list[list[str]]


def _names(model: DistributedDataParallel) -> dict[int, str]:
    return {id(parameter): name for name, parameter in model.module.named_parameters()}


class SteadyBuckets:
    """DDP communication hook: DDP's own sum, and a resumed first step in the saved layout.

    :meth:`register` installs :meth:`sum_bucket` on the model; :meth:`layout` is what a
    checkpoint records, :meth:`resume_in` what a resumed run gives back.

    Args:
        model: The DDP model it is registered on.
    """

    def __init__(self, model: DistributedDataParallel) -> None:
        # The group is looked up at each call, not kept: a destroyed group must not outlive
        # its DDP wrapper's references (see accel.strategies.ddp.strategy.release_process_group).
        self.model = model
        self.scale = 1.0 / model.process_group.size()
        #: Buckets to sum the next synchronized step in (parameters), until it is summed.
        self._first_layout: list[list[torch.Tensor]] | None = None
        #: The rebuilt layout, by bucket index, as the first step after DDP's rebuild showed it.
        self._rebuilt: dict[int, list[str]] = {}
        self._rebuilt_known = False
        #: ``time.perf_counter()`` when DDP last handed a bucket over (the slow-rank report's
        #: backward clock: this rank's gradients were ready then); 0.0 before the first.
        self.ready_at = 0.0

    def register(self) -> None:
        """Install this hook on its model (DDP takes one communication hook per model)."""
        self.model.register_comm_hook(None, self.sum_bucket)

    def layout(self) -> Layout | None:
        """The buckets the model's next synchronized step sums in; ``None``: DDP's initial ones.

        A rebuild that DDP has recorded but not made yet (a save between the first synchronized
        step and the next forward) is made here, as the next forward would; only then are the
        buckets read from DDP (which copies them once). Call on every process: the rebuild
        broadcasts rank 0's layout.
        """
        reducer = self.model.reducer
        if reducer._rebuild_buckets():
            names = _names(self.model)
            self._rebuilt = {
                index: [names[id(parameter)] for parameter in bucket.parameters()]
                for index, bucket in enumerate(reducer._get_zeros_like_grad_buckets())
            }
            self._rebuilt_known = True
        if not self._rebuilt_known:
            return None  # no synchronized step yet: the next one is in the initial buckets
        return [self._rebuilt[index] for index in sorted(self._rebuilt)]

    def resume_in(self, layout: Layout) -> None:
        """Sum the next synchronized step in ``layout`` (the saved run's buckets).

        Raises:
            ValueError: ``layout`` names a parameter this model lacks, or misses one.
        """
        by_name = dict(self.model.module.named_parameters())
        unknown = [name for bucket in layout for name in bucket if name not in by_name]
        listed = {name for bucket in layout for name in bucket}
        missing = [name for name, p in by_name.items() if p.requires_grad and name not in listed]
        if unknown or missing:
            raise ValueError(
                f"the checkpoint's DDP bucket layout does not fit this model (unknown "
                f"parameters {unknown[:3]}, missing {missing[:3]}): it was saved from another "
                "model. Load a checkpoint of this model."
            )
        self._first_layout = [[by_name[name] for name in bucket] for bucket in layout]

    def sum_bucket(self, state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Sum ``bucket`` over the group (DDP calls it once per bucket per synchronized step)."""
        self.ready_at = time.perf_counter()
        buffer = bucket.buffer()
        layout = self._first_layout
        if layout is not None:
            if bucket.is_last():
                self._first_layout = None
            return self._sum_in(layout, bucket)
        if not self._rebuilt_known and self.model._has_rebuilt_buckets:
            self._record(bucket)
        buffer.mul_(self.scale)
        work = dist.all_reduce(buffer, group=self.model.process_group, async_op=True)
        assert work is not None
        summed: torch.futures.Future[torch.Tensor] = work.get_future().then(
            lambda future: future.value()[0]
        )
        return summed

    def _record(self, bucket: GradBucket) -> None:
        """Note a bucket of the first step after DDP's rebuild (once; then it costs nothing)."""
        names = _names(self.model)
        self._rebuilt[bucket.index()] = [names[id(p)] for p in bucket.parameters()]
        if bucket.is_last():
            self._rebuilt_known = True

    def _sum_in(
        self, layout: list[list[torch.Tensor]], bucket: GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        """Sum ``bucket``'s gradients as flat buffers laid out as ``layout``'s buckets are."""
        gradients = {
            id(parameter): gradient
            for parameter, gradient in zip(bucket.parameters(), bucket.gradients(), strict=True)
        }
        mine = [members for members in layout if all(id(p) in gradients for p in members)]
        if sum(map(len, mine)) != len(gradients):
            warnings.warn(
                "accel: DDP's buckets changed after the checkpoint was written; this step is "
                "summed in the current layout, so the resumed run may differ from an "
                "uninterrupted one in the last bits.",
                stacklevel=1,
            )
            mine = [list(bucket.parameters())]
        works = []
        flats = []
        for members in mine:
            flat = torch.cat([gradients[id(p)].reshape(-1) for p in members]).mul_(self.scale)
            work = dist.all_reduce(flat, group=self.model.process_group, async_op=True)
            assert work is not None
            works.append(work)
            flats.append((flat, members))
        for work in works:
            work.wait()
        for flat, members in flats:
            offset = 0
            for parameter in members:
                gradient = gradients[id(parameter)]
                gradient.copy_(flat[offset : offset + gradient.numel()].view_as(gradient))
                offset += gradient.numel()
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future
