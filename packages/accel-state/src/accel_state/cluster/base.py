"""What a cluster environment tells a process about its place in the job."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping

from accel_state.errors import EnvironmentConfigError

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500


@dataclasses.dataclass(frozen=True)
class ProcessLayout:
    """Where this process sits in the job.

    Attributes:
        rank: Global index of this process, ``0 <= rank < world_size``.
        local_rank: Index of this process on its machine.
        world_size: Number of processes in the whole job.
        local_world_size: Number of processes on this machine.
        node_rank: Index of this machine.
        num_nodes: Number of machines.
        master_addr: Address of the rank-0 machine, for the rendezvous store.
        master_port: Port of the rendezvous store.
        source: Name of the cluster environment that produced the layout.

    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT
    source: str = "local"

    def __post_init__(self) -> None:
        checks = [
            (self.world_size >= 1, f"world_size={self.world_size} must be >= 1"),
            (
                0 <= self.rank < self.world_size,
                f"rank={self.rank} must be in [0, world_size={self.world_size})",
            ),
            (
                1 <= self.local_world_size <= self.world_size,
                f"local_world_size={self.local_world_size} must be in [1, world_size={self.world_size}]",
            ),
            (
                0 <= self.local_rank < self.local_world_size,
                f"local_rank={self.local_rank} must be in [0, local_world_size={self.local_world_size})",
            ),
            (
                1 <= self.num_nodes <= self.world_size,
                f"num_nodes={self.num_nodes} must be in [1, world_size={self.world_size}]",
            ),
            (
                0 <= self.node_rank < self.num_nodes,
                f"node_rank={self.node_rank} must be in [0, num_nodes={self.num_nodes})",
            ),
            (
                0 < self.master_port < 65536,
                f"master_port={self.master_port} must be a TCP port in 1..65535",
            ),
        ]
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise EnvironmentConfigError(
                f"Inconsistent process layout from the {self.source} environment: "
                + "; ".join(problems)
                + ". Check the launcher's variables."
            )


class ClusterEnvironment(abc.ABC):
    """One way of being launched (torchrun, SLURM, MPI, XLA, a plain process).

    Subclasses read only their own variables: :meth:`detect` says whether they apply and
    :meth:`layout` turns the variables into a :class:`ProcessLayout`.
    """

    name: str = "abstract"

    @classmethod
    @abc.abstractmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Return whether this environment launched the current process."""

    @classmethod
    @abc.abstractmethod
    def layout(cls, environ: Mapping[str, str]) -> ProcessLayout:
        """Read the process layout.

        Raises:
            EnvironmentConfigError: A variable is missing, malformed, or contradicts another.

        """


def node_count(world_size: int, local_world_size: int, source: str) -> int:
    """Number of machines when every machine runs ``local_world_size`` processes.

    Raises:
        EnvironmentConfigError: When ``world_size`` is not a multiple of ``local_world_size``.

    """
    if local_world_size < 1 or world_size % local_world_size:
        raise EnvironmentConfigError(
            f"{source}: world size {world_size} is not a multiple of the processes per machine "
            f"({local_world_size}); uneven machines need the launcher to export a node count."
        )
    return world_size // local_world_size
