"""Cross-process triggers: one process raises a flag, every process sees it at the next check.

Typical use is early stopping: any rank calls :meth:`Trigger.set`, and all ranks call
:meth:`Trigger.check` at the same point of the loop (it is a collective) and break together.
"""

from __future__ import annotations

import torch

import accel_ops


class Trigger:
    """A flag summed across processes at each :meth:`check`.

    Args:
        device: Where the flag tensor lives (the device the backend communicates).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flag_tensor = torch.tensor(0, device=device)

    def set(self) -> None:
        """Raise the flag on this process."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check(self) -> bool:
        """Collective: True on every process when any process raised the flag since the last check.

        The flag is lowered again when it is seen, so the next check starts fresh.
        """
        total = accel_ops.reduce(self.flag_tensor, reduction="sum")
        if int(total.item()) >= 1:
            self.flag_tensor = torch.tensor(0, device=self.device)
            return True
        return False
