"""``accel env``: versions, platform, hardware and the config in effect, ready to paste in an issue."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys
from typing import Any

from accel_launch.config.files import read_config_file
from accel_launch.config.paths import locate_config_file
from accel_launch.errors import ConfigError
from accel_launch.hardware import cpu_count
from accel_state.network import route_to, user_choice


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register ``env``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "env",
        help="Print versions, hardware and config, ready to paste in a bug report.",
        description="Print versions, platform, hardware and the config in effect.",
    )
    parser.add_argument(
        "--config_file", default=None, help="Config file to show (default: the default one)."
    )
    parser.set_defaults(handler=env_command)
    return parser


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _memory_gib() -> str:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return "unknown"
    return f"{pages * size / 2**30:.2f} GiB"


def _accelerators() -> list[str]:
    import torch

    lines = [f"PyTorch version: {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})"]
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
        lines.append(f"CUDA GPUs: {len(names)} ({', '.join(names)})")
    else:
        lines.append("CUDA GPUs: none available")
    mps = getattr(torch.backends, "mps", None)
    lines.append(f"MPS available: {bool(mps and mps.is_available())}")
    xpu = getattr(torch, "xpu", None)
    lines.append(f"XPU available: {bool(xpu and xpu.is_available())}")
    lines.append(_xla_line())
    return lines


def _xla_line() -> str:
    """torch_xla's version and the PJRT device it would use (the runtime is not started)."""
    if importlib.util.find_spec("torch_xla") is None:
        return "torch_xla: not installed"
    device = os.environ.get("PJRT_DEVICE") or "unset (torch_xla picks TPU if present, else CPU)"
    return f"torch_xla: {_version('torch_xla')} (PJRT_DEVICE: {device})"


def _config_lines(config_file: str | None) -> list[str]:
    location = locate_config_file(config_file)
    if location.path is None:
        return ["accel config: not found (defaults apply; run `accel config`)"]
    try:
        data = read_config_file(location.path).to_dict()
    except ConfigError as error:
        return [f"accel config: {location.path} is invalid: {error}"]
    lines = [f"accel config: {location.path}" + (" (Accelerate's file)" if location.note else "")]
    for key, value in sorted(data.items()):
        if isinstance(value, dict):
            lines.append(f"\t- {key}:")
            lines.extend(f"\t\t- {inner}: {item}" for inner, item in sorted(value.items()))
        else:
            lines.append(f"\t- {key}: {value}")
    return lines


def _network_line(config_file: str | None) -> str:
    """Which interface the backends use across machines: the user's, or the one accel chooses."""
    chosen = user_choice(os.environ)
    if chosen:
        named = ", ".join(f"{name}={value}" for name, value in chosen.items())
        return f"Network interface for several machines: {named} (set by you)"
    main_host = None
    location = locate_config_file(config_file)
    if location.path is not None:
        try:
            config = read_config_file(location.path)
        except ConfigError:
            config = None
        if config is not None and (config.num_machines or 1) > 1:
            main_host = config.main_process_ip
    if main_host:
        choice = route_to(main_host)
        if choice is not None:
            return f"Network interface for several machines: {choice.describe()} (chosen by accel)"
        return f"Network interface for several machines: no route to main_process_ip {main_host}"
    return (
        "Network interface for several machines: chosen at launch (the one that routes to "
        "--main_process_ip; GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME not set)"
    )


#: accel's distributions, each reported with its version ("not installed" when absent).
ACCEL_DISTRIBUTIONS = (
    "accel",
    "accel-launch",
    "accel-state",
    "accel-ops",
    "accel-data",
    "accel-ckpt",
)
#: The ``Project-URL`` labels of accel-launch's metadata that name the issue tracker.
ISSUE_URL_LABELS = ("issues", "bug tracker", "tracker", "bugs")


def issue_tracker(project_urls: list[str]) -> str | None:
    """The issue tracker's address among ``Project-URL`` entries (``"Label, address"``), if any."""
    for entry in project_urls:
        label, _, address = entry.partition(",")
        if label.strip().lower() in ISSUE_URL_LABELS and address.strip():
            return address.strip()
    return None


def report_header() -> str:
    """Where to paste the report: the tracker named in accel-launch's metadata, or how to find it."""
    try:
        urls = importlib.metadata.metadata("accel-launch").get_all("Project-URL") or []
    except importlib.metadata.PackageNotFoundError:
        urls = []
    address = issue_tracker(urls)
    if address is not None:
        return f"Copy-and-paste the text below in a new issue at {address}"
    return (
        "Copy-and-paste the text below in a new issue on the issue tracker of the repository "
        "you installed accel from (accel-launch's package metadata names no tracker)"
    )


def env_report(config_file: str | None = None) -> str:
    """The report as text: a markdown list."""
    items = [
        *(f"`{name}` version: {_version(name)}" for name in ACCEL_DISTRIBUTIONS),
        f"`accel` executable: {shutil.which('accel') or 'not on PATH'}",
        f"Platform: {platform.platform()}",
        f"Python version: {sys.version.split()[0]} ({sys.executable})",
        f"PyYAML version: {_version('PyYAML')}",
        f"NumPy version: {_version('numpy')}",
        *_accelerators(),
        f"CPU cores available: {cpu_count()} (machine: {os.cpu_count()})",
        f"System RAM: {_memory_gib()}",
        _network_line(config_file),
        *_config_lines(config_file),
    ]
    body = [item if item.startswith("\t") else f"- {item}" for item in items]
    return "\n".join([report_header(), "", *body])


def env_command(args: argparse.Namespace) -> int:
    """Print the report."""
    print(env_report(args.config_file))
    return 0
