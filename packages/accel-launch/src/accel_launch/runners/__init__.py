"""Runners execute a :class:`~accel_launch.plan.LaunchPlan`.

One process, torch elastic, torch_xla, or replica groups (``--ft_replicas``).
"""

from __future__ import annotations

from accel_launch.plan import ELASTIC, SINGLE, XLA, LaunchPlan


def run_plan(plan: LaunchPlan) -> int:
    """Run ``plan`` with the runner its mode names; return the exit code for the launcher.

    Raises:
        JobFailedError: Never for worker failures (those become the exit code); only for failures
            of the launch machinery itself.
    """
    if plan.fault_tolerance is not None:
        from accel_launch.runners.replica_groups import run_replica_groups

        return run_replica_groups(plan)
    if plan.mode == SINGLE:
        from accel_launch.runners.single import run_single

        return run_single(plan)
    if plan.mode == ELASTIC:
        from accel_launch.runners.elastic import run_elastic

        return run_elastic(plan)
    if plan.mode == XLA:
        from accel_launch.runners.xla import run_xla

        return run_xla(plan)
    raise ValueError(f"unknown launch mode {plan.mode!r}")
