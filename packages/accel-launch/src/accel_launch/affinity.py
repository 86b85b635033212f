"""Process placement on the CPU: who am I among the local processes, and which cores do I run on.

Standard library only (it is imported by the worker wrapper ``_failure_recorder.py``).
:func:`set_numa_affinity` pins the calling process to the cores of one NUMA node (read from
``/sys/devices/system/node``): on a GPU machine the node of the process's GPU, as Accelerate does;
on a CPU run the local processes take disjoint, equal blocks of their node's cores. Where the
kernel publishes no NUMA information (not Linux, or no sysfs) it is a no-op.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

#: Where Linux lists NUMA nodes and their cores.
NODE_ROOT = Path("/sys/devices/system/node")
#: Set to ``1`` in the workers by ``accel launch --enable_cpu_affinity``.
CPU_AFFINITY_ENV = "ACCELERATE_CPU_AFFINITY"


@dataclasses.dataclass
class CPUInformation:
    """Where this process stands in a CPU-distributed job (Accelerate's ``CPUInformation``)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


def _int_from_env(names: Sequence[str], default: int, environ: Mapping[str, str]) -> int:
    for name in names:
        raw = environ.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None
    return default


def get_cpu_distributed_information(environ: Mapping[str, str] | None = None) -> CPUInformation:
    """Rank, world size and their local counterparts from torchrun's, MPI's or PMI's variables."""
    env = os.environ if environ is None else environ
    return CPUInformation(
        rank=_int_from_env(
            ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"), 0, env
        ),
        world_size=_int_from_env(
            ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"), 1, env
        ),
        local_rank=_int_from_env(
            (
                "LOCAL_RANK",
                "MPI_LOCALRANKID",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "MV2_COMM_WORLD_LOCAL_RANK",
            ),
            0,
            env,
        ),
        local_world_size=_int_from_env(
            (
                "LOCAL_WORLD_SIZE",
                "MPI_LOCALNRANKS",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
                "MV2_COMM_WORLD_LOCAL_SIZE",
            ),
            1,
            env,
        ),
    )


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8,10-11"`` (the kernel's cpulist format) -> ``[0, 1, 2, 3, 8, 10, 11]``."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        start, _, end = part.partition("-")
        cpus.extend(range(int(start), int(end or start) + 1))
    return cpus


def numa_nodes(root: Path = NODE_ROOT) -> dict[int, list[int]]:
    """NUMA node index -> its cores; empty where the kernel publishes no NUMA information.

    :func:`override_numa_affinity` keeps only the cores this process may run on.
    """
    nodes: dict[int, list[int]] = {}
    if not root.is_dir():
        return nodes
    for path in sorted(root.glob("node[0-9]*")):
        try:
            cores = parse_cpu_list((path / "cpulist").read_text())
        except (OSError, ValueError):
            continue
        if cores:
            nodes[int(path.name.removeprefix("node"))] = cores
    return nodes


def _gpu_numa_node(local_process_index: int) -> int | None:
    """The NUMA node of the CUDA device ``local_process_index`` (``None``: no GPU or unknown)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or local_process_index >= torch.cuda.device_count():
        return None
    props = torch.cuda.get_device_properties(local_process_index)
    bus = getattr(props, "pci_bus_id", None)
    domain = getattr(props, "pci_domain_id", 0)
    device = getattr(props, "pci_device_id", 0)
    if bus is None:
        return None
    path = Path(f"/sys/bus/pci/devices/{domain:04x}:{bus:02x}:{device:02x}.0/numa_node")
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def numa_cores_for(
    local_process_index: int,
    local_world_size: int,
    nodes: Mapping[int, list[int]],
    gpu_node: int | None = None,
) -> list[int]:
    """The cores one local process gets.

    With ``gpu_node`` (a GPU run): every core of that node. Otherwise local processes are dealt to
    the nodes round-robin and the processes sharing a node split its cores into equal blocks.
    """
    if gpu_node is not None and gpu_node in nodes:
        return list(nodes[gpu_node])
    order = sorted(nodes)
    node = order[local_process_index % len(order)]
    sharers = [i for i in range(max(local_world_size, 1)) if i % len(order) == order.index(node)]
    position = sharers.index(local_process_index) if local_process_index in sharers else 0
    cores = nodes[node]
    block = max(1, len(cores) // max(1, len(sharers)))
    chosen = cores[position * block : (position + 1) * block]
    return chosen or list(cores)


def override_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to its NUMA cores now (uncached; see :func:`set_numa_affinity`).

    Raises:
        ValueError: ``local_process_index`` is negative.
    """
    if local_process_index < 0:
        raise ValueError(
            f"local_process_index={local_process_index}: must be 0 or more (LOCAL_RANK)"
        )
    if verbose is None:
        verbose = os.environ.get("ACCELERATE_DEBUG_MODE", "").lower() in ("1", "true", "yes")
    nodes = numa_nodes()
    if not nodes or not hasattr(os, "sched_setaffinity"):
        logger.debug("no NUMA information on this machine; CPU affinity left unchanged")
        return
    allowed = os.sched_getaffinity(0)
    nodes = {n: [c for c in cores if c in allowed] for n, cores in nodes.items()}
    nodes = {n: cores for n, cores in nodes.items() if cores}
    if not nodes:
        return
    local_world_size = get_cpu_distributed_information().local_world_size
    cores = numa_cores_for(
        local_process_index, local_world_size, nodes, _gpu_numa_node(local_process_index)
    )
    os.sched_setaffinity(0, cores)
    if verbose:
        logger.info(
            "Assigning %d cpu cores to process %d: %s",
            len(cores),
            local_process_index,
            sorted(os.sched_getaffinity(0)),
        )


@functools.lru_cache
def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the cores of its NUMA node; cached, so later calls do nothing.

    Args:
        local_process_index: The index of this process on this machine (``LOCAL_RANK``).
        verbose: Log the cores chosen (default: when ``ACCELERATE_DEBUG_MODE`` is on).
    """
    override_numa_affinity(local_process_index, verbose=verbose)


def apply_launch_affinity(environ: Mapping[str, str] | None = None) -> None:
    """In a worker: pin it when the launcher asked (``ACCELERATE_CPU_AFFINITY=1``)."""
    env = os.environ if environ is None else environ
    if env.get(CPU_AFFINITY_ENV, "").strip().lower() in ("1", "true", "yes"):
        set_numa_affinity(get_cpu_distributed_information(env).local_rank)
