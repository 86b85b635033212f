"""torchrun's ``PET_*`` variables, which Kubeflow's operators set for the launcher in each pod.

``torchrun`` takes every flag from a ``PET_<FLAG>`` variable when the flag is not given; the
Kubeflow Trainer (and the PyTorchJob operator, for elastic jobs) exports ``PET_NNODES``,
``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` in each
pod and runs ``torchrun``. ``accel launch`` reads the same five: they go over the config file,
and ``accel launch``'s own flags go over them.
"""

from __future__ import annotations

from collections.abc import Mapping

from accel_launch.config.schema import AccelConfig
from accel_launch.errors import LaunchArgumentError

NNODES = "PET_NNODES"
NPROC_PER_NODE = "PET_NPROC_PER_NODE"
NODE_RANK = "PET_NODE_RANK"
MASTER_ADDR = "PET_MASTER_ADDR"
MASTER_PORT = "PET_MASTER_PORT"
#: torchrun's named process counts: accel's own default (one per GPU, else one) stands for them.
NAMED_PROCESS_COUNTS = ("auto", "gpu", "cpu", "xpu", "cuda")


def _integer(environ: Mapping[str, str], name: str, minimum: int, fix: str) -> int | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise LaunchArgumentError(
            f"{name}={text!r} must be an integer >= {minimum} (torchrun's variable, set by "
            f"Kubeflow's operator); {fix}"
        )
    return value


def _nodes(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """``PET_NNODES``: ``N``, or torchrun's elastic ``MIN:MAX`` -> ``(MIN, MAX)`` (``MIN`` None)."""
    text = environ.get(NNODES, "").strip()
    low, sep, high = text.partition(":")
    fix = "or pass --num_machines."
    if not sep:
        return None, _integer({NNODES: low}, NNODES, 1, fix)
    fewest = _integer({NNODES: low}, NNODES, 1, fix)
    most = _integer({NNODES: high}, NNODES, 1, fix)
    if fewest is None or most is None or fewest > most:
        raise LaunchArgumentError(
            f"{NNODES}={text!r} is not a machine range MIN:MAX with 1 <= MIN <= MAX (torchrun's "
            f"variable, set by Kubeflow's operator); {fix}"
        )
    return fewest, most


def torchrun_env_config(environ: Mapping[str, str]) -> tuple[AccelConfig, list[str]]:
    """The launch settings the ``PET_*`` variables of ``environ`` give, and notes saying so.

    Raises:
        LaunchArgumentError: A variable holds something torchrun would refuse too.
    """
    fewest, nodes = _nodes(environ)
    per_node_text = environ.get(NPROC_PER_NODE, "").strip()
    per_node = None
    if per_node_text and per_node_text.lower() not in NAMED_PROCESS_COUNTS:
        per_node = _integer(environ, NPROC_PER_NODE, 1, "or pass --num_processes.")
    settings = {
        "num_machines": nodes,
        "min_num_machines": fewest,
        "num_processes": per_node * (nodes or 1) if per_node is not None else None,
        "machine_rank": _integer(environ, NODE_RANK, 0, "or pass --machine_rank."),
        "main_process_ip": environ.get(MASTER_ADDR, "").strip() or None,
        "main_process_port": _integer(environ, MASTER_PORT, 1, "or pass --main_process_port."),
    }
    names = {
        "num_machines": NNODES,
        "min_num_machines": NNODES,
        "num_processes": NPROC_PER_NODE,
        "machine_rank": NODE_RANK,
        "main_process_ip": MASTER_ADDR,
        "main_process_port": MASTER_PORT,
    }
    used = list(
        dict.fromkeys(
            f"{names[key]}={environ[names[key]]}"
            for key, value in settings.items()
            if value is not None
        )
    )
    notes = [f"read torchrun's variables (Kubeflow): {', '.join(used)}"] if used else []
    return AccelConfig(**settings), notes  # type: ignore[arg-type]
