"""The docs' torch-version table: which feature works on which torch, from the feature gates.

The gated rows come from ``accel_state.torch_compat.GATES``, the data the errors are made from, so
the table and the messages cannot disagree. The other rows are features that work on every torch
accel supports; each names the CI leg or test that shows it. ``scripts/docs_reference.py``
renders the page as ``reference/torch-versions.md``; ``python scripts/torch_feature_table.py``
prints the same markdown.
"""

from __future__ import annotations

import dataclasses
import html

from accel_state.torch_compat import (
    GATES,
    OLDEST_SUPPORTED_TORCH,
    FeatureGate,
    release_of,
    torch_at_least,
)

#: The torch releases CI tests (``constraints/torch-*.txt`` and ``constraints/cpu.txt``), oldest
#: first; a column each. Kept equal to the pins by ``tests-integration``'s table test.
TESTED_RELEASES = ("2.4", "2.6", "2.13", "2.15")


@dataclasses.dataclass(frozen=True)
class Ungated:
    """A feature that works on every supported torch, with what it still depends on."""

    feature: str
    note: str


#: Features of the issue's list that need no gate: what they depend on besides torch.
UNGATED = (
    Ungated("DDP (multi-CPU, multi-GPU, several machines)", "torch.distributed only."),
    Ungated(
        "FSDP1 (fsdp_version=1, the FSDP wrapper)",
        "Full and sharded checkpoints. A resumed run equals the uninterrupted one bit for bit "
        "from torch 2.6; on 2.4 to float rounding (about 1e-7 relative; 2.5 untested).",
    ),
    Ungated(
        "DeepSpeed ZeRO 1-3",
        "Any torch the installed DeepSpeed supports (CI: DeepSpeed 0.19.8 on each leg).",
    ),
    Ungated(
        "bitsandbytes 8-bit and 4-bit models",
        "Any torch the installed bitsandbytes supports (it declares its own floor).",
    ),
    Ungated("Big-model dispatch (device_map, offload, init_empty_weights)", "Plain torch."),
    Ungated(
        "Async sharded save (save_state(async_save=True))",
        "accel's own staging thread; torch 2.4 and 2.5 write torch's per-record CRC-32 as well.",
    ),
    Ungated(
        "Elastic resume (accel launch --max_restarts, save/resume in a fresh launch)",
        "torch elastic (torchrun's agent).",
    ),
    Ungated(
        "XLA (TPU, PJRT_DEVICE)",
        "torch_xla of the same release as torch (CI: torch_xla 2.9.0 on torch 2.9.0).",
    ),
)


def cell(text: str) -> str:
    """``text`` safe inside a markdown table cell."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\n", " ")


def mark(gate: FeatureGate | None, release: str) -> str:
    """A release column's entry for ``gate`` (``None``: works everywhere)."""
    if gate is None or gate.available(release, device_type="cpu"):
        return "works"
    if gate.available(release):
        return f"CPU: gated (needs {gate.cpu_minimum}); GPUs: allowed, untested in CI"
    return f"gated (needs {gate.minimum})"


def render() -> str:
    """The page's markdown."""
    columns = " | ".join(f"torch {release}" for release in TESTED_RELEASES)
    lines = [
        "# torch versions",
        "",
        f"accel installs on torch {OLDEST_SUPPORTED_TORCH} and every newer release: each "
        "package declares `torch>="
        f"{OLDEST_SUPPORTED_TORCH}`, and `pip install` never upgrades or downgrades the torch "
        "a venv already holds. A feature that an older torch cannot do is *gated*: it fails at "
        "`Accelerator(...)`, `prepare()` or `accel launch` with the message in the last column, "
        "which names the feature, the torch found, the release needed and what works instead "
        "(the error is `accel_state.TorchFeatureError`; accel's own is "
        "`accel.errors.TorchVersionError`, an `UnsupportedFeatureError` too). Nothing fails at "
        "import time, and `import accel` and the plain DDP path never load DTensor.",
        "",
        "Generated from `accel_state.torch_compat.GATES`, the same data the errors are made "
        "from. The columns are the releases CI tests: the oldest supported, one in the middle, "
        "the release the full suite runs on, and the newest on PyPI (see the README).",
        "",
        f"| feature | {columns} | needs |",
        "| --- | " + " | ".join("---" for _ in TESTED_RELEASES) + " | --- |",
    ]
    for item in UNGATED:
        marks = " | ".join(mark(None, release) for release in TESTED_RELEASES)
        lines.append(f"| {cell(item.feature)} | {marks} | {cell(item.note)} |")
    for gate in sorted(GATES.values(), key=lambda gate: (release_of(gate.minimum), gate.key)):
        marks = " | ".join(mark(gate, release) for release in TESTED_RELEASES)
        needs = f"torch {gate.minimum}" + (f" ({gate.also_needs})" if gate.also_needs else "")
        if gate.cpu_minimum:
            needs += f"; on the CPU (gloo): torch {gate.cpu_minimum}"
        if gate.limit:
            needs += f"; on every torch: {gate.limit}"
        lines.append(f"| {cell(gate.feature)} | {marks} | {cell(needs)} |")
    lines += ["", "## The messages", ""]
    for gate in sorted(GATES.values(), key=lambda gate: gate.key):
        older = _release_before(gate.minimum)
        lines += [
            f"### {cell(gate.feature)}",
            "",
            f"Gate `{gate.key}`. On torch {older}:",
            "",
            f"> {cell(gate.message(older))}",
            "",
        ]
        if gate.cpu_minimum:
            on_cpu = _release_before(gate.cpu_minimum)
            lines += [
                f"On the CPU with torch {on_cpu}:",
                "",
                f"> {cell(gate.message(on_cpu, device_type='cpu'))}",
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"


def _release_before(minimum: str) -> str:
    """The newest tested release older than ``minimum`` (the floor when none is)."""
    older = [release for release in TESTED_RELEASES if not torch_at_least(minimum, release)]
    return older[-1] if older else OLDEST_SUPPORTED_TORCH


if __name__ == "__main__":
    print(render(), end="")
