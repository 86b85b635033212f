"""Processes started by SLURM's ``srun``."""

from __future__ import annotations

import re
from collections.abc import Mapping

from accel_state.cluster.base import ClusterEnvironment, ProcessLayout
from accel_state.contract import FT_REPLICA_ID
from accel_state.envvars import read_int
from accel_state.errors import EnvironmentConfigError

_INTERACTIVE_JOB_NAMES = {"bash", "interactive"}
_BRACKET = re.compile(r"\[([^\]]*)\]")
_TASK_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def first_host(nodelist: str) -> str:
    """Return the first host of a SLURM host list such as ``gpu[003-005,9],cpu1``.

    Raises:
        EnvironmentConfigError: When the list is empty or its brackets do not close.

    """
    text = nodelist.strip()
    depth = 0
    end = len(text)
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = index
            break
    first = text[:end]
    if not first or first.count("[") != first.count("]"):
        raise EnvironmentConfigError(f"SLURM node list {nodelist!r} cannot be parsed.")

    def first_of_range(match: re.Match[str]) -> str:
        return match.group(1).split(",")[0].split("-")[0]

    return _BRACKET.sub(first_of_range, first)


def tasks_per_node(spec: str) -> list[int]:
    """Expand ``SLURM_TASKS_PER_NODE`` (``"4(x2),2"``) into one count per node (``[4, 4, 2]``).

    Raises:
        EnvironmentConfigError: When a part is not ``N`` or ``N(xM)``.

    """
    counts: list[int] = []
    for part in spec.split(","):
        match = _TASK_COUNT.match(part.strip())
        if match is None:
            raise EnvironmentConfigError(
                f"SLURM_TASKS_PER_NODE={spec!r} cannot be parsed; expected parts like 4 or 4(x2)."
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


class SlurmEnvironment(ClusterEnvironment):
    """Processes of an ``srun`` step.

    Reads ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODEID``, the task counts
    per node and the node list (its first host is the main address unless ``MASTER_ADDR`` is set).

    An interactive allocation (job name ``bash`` or ``interactive``) is not treated as a launch.
    """

    name = "slurm"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """True inside an ``srun`` step of a batch job."""
        return (
            "SLURM_PROCID" in environ
            and "SLURM_NTASKS" in environ
            and environ.get("SLURM_JOB_NAME", "") not in _INTERACTIVE_JOB_NAMES
        )

    @classmethod
    def layout(cls, environ: Mapping[str, str]) -> ProcessLayout:
        """Read the SLURM step's variables."""
        world_size_name = (
            "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
        )
        world_size = read_int(environ, world_size_name, minimum=1)
        rank = read_int(environ, "SLURM_PROCID", minimum=0)
        local_rank = read_int(environ, "SLURM_LOCALID", default=0, minimum=0)
        node_rank = read_int(environ, "SLURM_NODEID", default=0, minimum=0)
        spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
        counts = tasks_per_node(spec) if spec else [world_size]
        if sum(counts) != world_size:
            raise EnvironmentConfigError(
                f"SLURM task counts per node {counts} add up to {sum(counts)}, "
                f"but {world_size_name}={world_size}."
            )
        if node_rank >= len(counts):
            raise EnvironmentConfigError(
                f"SLURM_NODEID={node_rank} but the step spans only {len(counts)} node(s)."
            )
        nodelist = (
            environ.get("SLURM_STEP_NODELIST")
            or environ.get("SLURM_JOB_NODELIST")
            or environ.get("SLURM_NODELIST")
        )
        master_addr = environ.get("MASTER_ADDR") or (first_host(nodelist) if nodelist else "")
        if not master_addr:
            if len(counts) > 1:
                raise EnvironmentConfigError(
                    "SLURM multi-node step without SLURM_JOB_NODELIST or MASTER_ADDR; "
                    "export MASTER_ADDR with the address of the first node."
                )
            master_addr = "127.0.0.1"
        job_id = read_int(environ, "SLURM_JOB_ID", default=0, minimum=0)
        master_port = read_int(environ, "MASTER_PORT", default=15000 + job_id % 20000, minimum=1)
        return ProcessLayout(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=counts[node_rank],
            node_rank=node_rank,
            num_nodes=len(counts),
            master_addr=master_addr,
            master_port=master_port,
            source=cls.name,
        )


def check_task_count(environ: Mapping[str, str], layout: ProcessLayout) -> None:
    """Refuse a one-process world inside an ``srun`` step of several tasks.

    ``srun -n2 bash -c 'python train.py'`` names the job ``bash``, which reads as an interactive
    session: each task would then train alone, as two unrelated copies, with no word said. A
    process of a replica group (``accel launch --ft_replicas``, one group per task) is its own
    world by design: the groups meet through torchft, not through this world.

    Raises:
        EnvironmentConfigError: ``SLURM_PROCID`` is set, the step has more than one task, the
            world accel resolved has one process and it is not in a replica group.
    """
    if layout.world_size != 1 or "SLURM_PROCID" not in environ or FT_REPLICA_ID in environ:
        return
    name = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
    text = environ.get(name, "").strip()
    if not text.isdigit() or int(text) <= 1:
        return
    job_name = environ.get("SLURM_JOB_NAME", "")
    why = (
        f"SLURM_JOB_NAME={job_name!r} marks an interactive session, which accel does not take "
        "as a launch"
        if job_name in _INTERACTIVE_JOB_NAMES
        else f"the process was resolved by the {layout.source} environment"
    )
    raise EnvironmentConfigError(
        f"SLURM started {text} tasks ({name}={text}, this is SLURM_PROCID="
        f"{environ['SLURM_PROCID']}) but accel sees a 1-process world: {why}. Each task would "
        "train alone. To train them as one job, give the job another name (sbatch --job-name "
        "train, or srun --job-name train) or start one task per machine running accel launch "
        "(srun --ntasks-per-node 1 accel launch --num_processes N ...). To run this task alone, "
        f"run it in a one-task step (srun --ntasks 1) or unset {name}."
    )
