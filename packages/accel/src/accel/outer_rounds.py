"""Outer rounds of DiLoCo across replica groups: inner steps, then one sync of the groups.

A *round* is the inner steps between two syncs (``local_sgd_steps // fragments`` of them; with
streaming DiLoCo each sync covers one fragment). It is the unit of the shared position
(:mod:`accel_data.shared_position`): the round's samples are split between the groups of the
quorum formed at the previous sync, and the round's sync commits them all, or (the sync failed
and torchft restored the parameters to the last sync) hands them out again in the next round.

A sync whose quorum is not the one the round's samples were split by (a group died, or one
joined and healed) is refused by every group and finished at once: the parameters go back to
the last sync and the round's samples are handed out again, split by the new quorum. torchft's
commit vote is taken inside each group, so the groups first agree on refusing (one small
all-reduce across the quorum after it formed): a group that sees a change refuses for all.

Example:
    >>> rounds = OuterRounds(sync, training, inner_steps=8, sync_delay=0, device=device)
    >>> rounds.inner_step_done()  # after each optimizer step (LocalSGD.step)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from accel.replica_training import ReplicaGroupTraining
    from accel_state.torchft_api import OuterSync


class OuterRounds:
    """The schedule of DiLoCo syncs of one process, and their effect on the shared position.

    Example:
        >>> rounds = OuterRounds(sync, accelerator.replica_training, 4, 0, accelerator.device)
        >>> for _ in range(4):
        ...     rounds.inner_step_done()  # the 4th starts and finishes a sync
        >>> rounds.committed_syncs
        1

    Args:
        sync: torchft's DiLoCo, phase by phase.
        training: The Accelerator's replica-group side (quorum split, loaders).
        inner_steps: Inner steps per round (``local_sgd_steps // fragments``).
        sync_delay: Inner steps between starting a sync and finishing it.
        device: This process's device (the agreement's tensor).
    """

    def __init__(
        self,
        sync: OuterSync,
        training: ReplicaGroupTraining,
        inner_steps: int,
        sync_delay: int,
        device: torch.device,
    ) -> None:
        self.sync = sync
        self.device = device
        self.training = training
        self.inner_steps = inner_steps
        self.sync_delay = sync_delay
        #: Inner steps done in the round in progress.
        self.local_step = 0
        #: Syncs of this process that committed, and those that did not.
        self.committed_syncs = 0
        self.failed_syncs = 0

    def inner_step_done(self) -> None:
        """Count one inner step; start or finish the round's sync when it is due."""
        self.local_step += 1
        if not self.sync.started and self.local_step >= self.inner_steps - self.sync_delay:
            self._start()
        if self.sync.started and self.local_step >= self.inner_steps:
            self._finish()

    def close_round(self) -> None:
        """Sync now: the epoch's samples are all handed out, or the training block ends."""
        if not self.sync.started:
            self._start()
        if self.sync.started:
            self._finish()

    def sync_all_fragments(self) -> None:
        """Finish the round, then sync every other fragment once (the groups end equal)."""
        if self.local_step > 0 or self.sync.started or self.training.round_pending():
            self.close_round()
        for _ in range(self.sync.fragments - 1):
            self.close_round()

    def join(self, commit: bool) -> None:
        """The sync of a group joining the job, after its quorum was formed (and healed it).

        Args:
            commit: The job has not trained yet and every group starts here (the sync carries
                no pseudo-gradient and may commit); otherwise it is refused.
        """
        agreed = self._agree(refuse=not commit)
        self.sync.start()
        if not agreed:
            self.sync.manager.report_error(
                "a replica group joined the job: the round's samples were split without it"
            )
        self._finish()

    def _start(self) -> None:
        self.sync.manager.start_step()
        agreed = self._agree(refuse=self.training.quorum_place() != self.training.round_split)
        self.sync.start()
        if not agreed:
            # Every group of the quorum refuses; finish now, the round is over.
            self.sync.manager.report_error(
                "the replica groups changed since the round's samples were split"
            )
            self._finish()

    def _agree(self, refuse: bool) -> bool:
        """Whether no group of the quorum refuses the sync (False too if the collective failed)."""
        average = self.sync.manager.average_value(1.0 if refuse else 0.0, self.device)
        return bool(average == 0.0)

    def _finish(self) -> None:
        committed = self.sync.finish()
        if committed:
            self.committed_syncs += 1
        else:
            self.failed_syncs += 1
        self.local_step = 0
        self.training.round_ended(committed)
