"""Run replica groups that outlive one another's failures (``accel launch --ft_replicas N``).

This launcher starts a torchft lighthouse (unless ``--ft_lighthouse`` names one elsewhere) and
one launcher process per replica group. Each group launcher runs an ordinary elastic job of
``--num_processes`` processes with a rendezvous of its own, so every group is its own torch
world, and tells its workers who they are (``ACCEL_FT_REPLICA_ID``, ``ACCEL_FT_REPLICAS``,
``ACCEL_FT_MIN_REPLICAS``, ``TORCHFT_LIGHTHOUSE``). A group that fails is relaunched, up to
``--max_restarts`` times, while the other groups go on training: their processes are never
restarted for it. Group launchers die with this one (parent-death signal), and SIGTERM or
SIGINT here is passed to every group as SIGTERM (exit 75 after SIGTERM, 130 after SIGINT).

Once a group has finished (its script returned, exit code 0), the job's samples are all trained
in committed steps: this launcher creates the file ``ACCEL_FT_JOB_FINISHED_FILE`` names, so that
a relaunched group still waiting for a live group to heal from exits with code 0 instead of
waiting out its quorum timeout, and a group that fails after that is not relaunched (there is
nothing left to train, and no live group to heal from) and counts as a relaunch would end: exit
code 0, unless it was out of restarts.

``python -m accel_launch.runners.replica_groups PLAN`` is the group launcher's entry: it runs the
pickled one-group plan that this launcher wrote into a private folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from accel_launch.errors import MissingDependencyError
from accel_launch.plan import LaunchPlan
from accel_launch.replica_plan import DEFAULT_LIGHTHOUSE_PORT, ReplicaGroups
from accel_launch.runners.guard import guarded
from accel_state.contract import (
    FT_GROUP_RESTART_COUNT,
    FT_JOB_FINISHED_FILE,
    FT_LIGHTHOUSE,
    FT_MIN_REPLICAS,
    FT_REPLICA_ID,
    FT_REPLICAS,
    REQUEUE_EXIT_CODE,
)
from accel_state.torchft_api import quiet_torchft_logs

#: Seconds between checks of the group launchers.
POLL_SECONDS = 0.1
#: Seconds the group launchers get to stop after SIGTERM before they are killed.
STOP_GRACE_SECONDS = 30.0


@dataclasses.dataclass
class GroupLauncher:
    """One replica group's launcher process and how often it was relaunched."""

    replica_id: int
    plan_file: Path
    finished_file: Path
    restarts: int = 0
    process: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None

    def start(self, lighthouse: str, groups: ReplicaGroups) -> None:
        """Start (or restart) this group's launcher."""
        env = {
            **quiet_torchft_logs(dict(os.environ)),
            FT_REPLICA_ID: str(self.replica_id),
            FT_REPLICAS: str(groups.replicas),
            FT_MIN_REPLICAS: str(groups.min_replicas),
            FT_LIGHTHOUSE: lighthouse,
            FT_GROUP_RESTART_COUNT: str(self.restarts),
            FT_JOB_FINISHED_FILE: str(self.finished_file),
        }
        command = [sys.executable, "-m", "accel_launch.runners.replica_groups", str(self.plan_file)]
        self.process = subprocess.Popen(guarded(command), env=env, start_new_session=True)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to this group's launcher and everything in its session."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)


def group_plan(plan: LaunchPlan) -> LaunchPlan:
    """The plan one group launcher runs: the job's, without restarts (this launcher relaunches)."""
    return dataclasses.replace(plan, fault_tolerance=None, max_restarts=0)


def _say(plan: LaunchPlan, line: str) -> None:
    if not plan.quiet:
        print(f"accel launch: {line}", file=sys.stderr, flush=True)


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


@contextlib.contextmanager
def _lighthouse(plan: LaunchPlan, groups: ReplicaGroups) -> Iterator[str]:
    """The lighthouse's address: the one named, or one started here for the job's length."""
    if groups.lighthouse is not None:
        yield groups.lighthouse
        return
    from accel_state.errors import FaultToleranceUnavailableError
    from accel_state.torchft_api import start_lighthouse

    os.environ.update(quiet_torchft_logs(dict(os.environ)))  # read as torchft starts logging
    host = plan.rdzv_endpoint.rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
    try:
        lighthouse = start_lighthouse(host, DEFAULT_LIGHTHOUSE_PORT, groups.min_replicas)
    except FaultToleranceUnavailableError as error:
        raise MissingDependencyError(str(error)) from error
    try:
        yield lighthouse.address
    finally:
        lighthouse.shutdown()


@contextlib.contextmanager
def _forward_stop_signals(groups: list[GroupLauncher], stopping: list[int]) -> Iterator[None]:
    """SIGTERM/SIGINT here: remember it and pass SIGTERM to every group launcher."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)
        for group in groups:
            group.signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_stopped(groups: list[GroupLauncher]) -> None:
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for group in groups:
        if group.process is None:
            continue
        try:
            group.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            group.signal(signal.SIGKILL)
            group.process.wait()
        if group.exit_code is None:
            group.exit_code = group.process.returncode


def _final_code(groups: list[GroupLauncher], stopped_by: int | None) -> int:
    codes = [group.exit_code or 0 for group in groups]
    if stopped_by == signal.SIGINT:
        return 130  # interrupted, as any launch stopped with Ctrl-C
    if stopped_by is not None and all(code in (0, REQUEUE_EXIT_CODE) for code in codes):
        return REQUEUE_EXIT_CODE if REQUEUE_EXIT_CODE in codes else 0
    failed = [code for code in codes if code != 0]
    if not failed:
        return 0
    return failed[0] if failed[0] > 0 else 128 - failed[0]


def run_replica_groups(plan: LaunchPlan) -> int:
    """Run every replica group of ``plan`` and relaunch those that fail; return the exit code.

    The job succeeds when every group ends with exit code 0. A group out of restarts is
    reported and left out; the others go on (torchft lets a step commit without it), and the
    exit code is that group's. Once a group has finished, a failed group is not relaunched
    and counts as exit code 0 while it had restarts left (a relaunch would find nothing to
    train).
    """
    groups_plan = plan.fault_tolerance
    assert groups_plan is not None
    with tempfile.TemporaryDirectory(prefix="accel-ft-") as folder:
        plan_file = Path(folder) / "group-plan.pickle"
        plan_file.write_bytes(pickle.dumps(group_plan(plan)))
        finished_file = Path(folder) / "job-finished"
        groups = [
            GroupLauncher(replica_id, plan_file, finished_file)
            for replica_id in groups_plan.replica_ids
        ]
        stopping: list[int] = []
        with _lighthouse(plan, groups_plan) as lighthouse, _forward_stop_signals(groups, stopping):
            _say(
                plan,
                f"fault tolerance: {len(groups)} of {groups_plan.replicas} replica group(s) of "
                f"{plan.nproc_per_node} process(es) here, lighthouse at {lighthouse} (a step "
                f"commits with at least {groups_plan.min_replicas} group(s)); a failed group is "
                f"relaunched up to {plan.max_restarts} time(s) while the others go on",
            )
            for group in groups:
                group.start(lighthouse, groups_plan)
            _supervise(plan, groups, groups_plan, lighthouse, stopping)
            if stopping:
                _wait_stopped(groups)
        return _final_code(groups, stopping[0] if stopping else None)


def _supervise(
    plan: LaunchPlan,
    groups: list[GroupLauncher],
    groups_plan: ReplicaGroups,
    lighthouse: str,
    stopping: list[int],
) -> None:
    """Wait until every group ended for good, relaunching failed ones while restarts last.

    After a group finished, failed groups are not relaunched (see the module's docstring).
    """
    finished_by: int | None = None
    while not stopping and any(group.exit_code is None for group in groups):
        time.sleep(POLL_SECONDS)
        for group in groups:
            if group.exit_code is not None or group.process is None or stopping:
                continue
            code = group.process.poll()
            if code is None:
                continue
            if code == 0:
                group.exit_code = 0
                _say(plan, f"replica group {group.replica_id} finished")
                if finished_by is None:
                    finished_by = group.replica_id
                    group.finished_file.write_text(f"replica group {group.replica_id}\n")
            elif finished_by is not None and group.restarts < plan.max_restarts:
                # A relaunch would find the job finished and exit 0: count that outcome now.
                group.exit_code = 0
                _say(
                    plan,
                    f"replica group {group.replica_id} failed ({_describe(code)}) after replica "
                    f"group {finished_by} had finished the job; not relaunched: every sample "
                    "was trained in a committed step, so nothing is left to train (what this "
                    "group did after its last step, such as its own evaluation output, may be "
                    "incomplete)",
                )
            elif group.restarts < plan.max_restarts:
                group.restarts += 1
                _say(
                    plan,
                    f"replica group {group.replica_id} failed ({_describe(code)}); relaunching "
                    f"it (restart {group.restarts} of {plan.max_restarts}); the other groups "
                    "go on",
                )
                group.start(lighthouse, groups_plan)
            else:
                group.exit_code = code
                _say(
                    plan,
                    f"replica group {group.replica_id} failed ({_describe(code)}) with no "
                    f"restarts left (--max_restarts {plan.max_restarts}); the other groups go on "
                    "without it",
                )


def main(argv: list[str]) -> int:
    """The group launcher: run the pickled one-group plan at ``argv[1]``."""
    from accel_launch.runners import run_plan

    plan = pickle.loads(Path(argv[1]).read_bytes())
    return run_plan(plan)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
