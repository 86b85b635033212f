"""The docs' torch-version table (``scripts/torch_feature_table.py``) against the gates and the pins.

The table's columns must be the releases CI tests, its gated rows the gates the errors come from,
and the features the torch-floor issue lists must all have a row.
"""

from __future__ import annotations

import re
from pathlib import Path

from repo_scripts import load_script

from accel_state.torch_compat import GATES, release_of

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints"


table = load_script("torch_feature_table")


def pinned_minor(name: str) -> str:
    text = (CONSTRAINTS / name).read_text()
    version = re.search(r"^torch==(\S+)", text, re.M)
    assert version is not None, f"constraints/{name} pins no torch"
    return ".".join(str(part) for part in release_of(version.group(1))[:2])


def test_the_columns_are_the_releases_ci_tests():
    tested = [pinned_minor(name) for name in ("torch-oldest.txt", "torch-middle.txt")]
    tested += [pinned_minor("cpu.txt"), pinned_minor("torch-newest.txt")]
    assert list(table.TESTED_RELEASES) == tested


def test_every_gate_has_a_row_and_its_message():
    page = table.render()
    for gate in GATES.values():
        row = next(
            line for line in page.splitlines() if line.startswith(f"| {table.cell(gate.feature)} |")
        )
        columns = [cell.strip() for cell in row.strip("|").split("|")][1:-1]
        expected = []
        for release in table.TESTED_RELEASES:
            if gate.available(release, device_type="cpu"):
                expected.append("works")
            elif gate.available(release):
                expected.append(
                    f"CPU: gated (needs {gate.cpu_minimum}); GPUs: allowed, untested in CI"
                )
            else:
                expected.append(f"gated (needs {gate.minimum})")
        assert columns == expected, gate.key
        if gate.cpu_minimum:
            assert f"on the CPU (gloo): torch {gate.cpu_minimum}" in row, gate.key
        assert f"Gate `{gate.key}`" in page


def test_the_features_the_issue_names_are_all_in_the_table():
    page = table.render().lower()
    for feature in (
        "ddp",
        "fsdp1",
        "fsdp2",
        "deepspeed zero 1-3",
        "device meshes",
        "tensor parallelism",
        "fp8",
        "bitsandbytes",
        "big-model dispatch",
        "async sharded save",
        "elastic resume",
        "replica groups",
        "xla",
    ):
        assert f"| {feature}" in page or feature in page, feature
