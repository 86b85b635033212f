"""Each nox session's wall time, outcome and pytest counts, as the table ``nox -t ci`` ends with.

The noxfile's ``timed`` decorator saves a :class:`SessionTime` per session it ran as a record file
(:func:`save_record`), so that sessions run by ``nox --parallel`` (each in a nox process of its
own) are counted too; the last session, ``ci_times``, reads this run's records
(:func:`load_records`), prints :func:`format_table` and writes :func:`report` as JSON. Standard
library only: the noxfile imports it into nox's own interpreter.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

SUCCESS = "success"
FAILED = "failed"
SKIPPED = "skipped"


@dataclasses.dataclass(frozen=True)
class PytestCounts:
    """Test outcomes summed over the ``<testsuite>`` elements of a pytest junit XML file."""

    passed: int
    failed: int
    skipped: int
    errors: int

    def __str__(self) -> str:
        counts = f"{self.passed}/{self.failed}/{self.skipped}"
        return f"{counts} +{self.errors} errors" if self.errors else counts


@dataclasses.dataclass(frozen=True)
class SessionTime:
    """One session of a nox run.

    Attributes:
        name: The session's name, parameters included (``tests(package='accel', backend='cpu')``).
        result: ``success``, ``failed`` or ``skipped``.
        seconds: Wall time of the session function (after nox created or reused its venv).
        setup_seconds: Wall time between the newest end of a session before it (or the run's
            start) and this session's start: mostly creating or checking its venv.
        tests: What its pytest run reported, or ``None`` where it ran none or wrote no report.
        started: When the session function started (seconds since the epoch; 0 if unknown).
        cpu_seconds: CPU time (user + system) of the processes the session ran and waited for,
            their children included: what it cost the machine, where ``seconds`` also counts
            waiting and the other sessions beside it.
    """

    name: str
    result: str
    seconds: float
    setup_seconds: float
    tests: PytestCounts | None = None
    started: float = 0.0
    cpu_seconds: float = 0.0

    @property
    def ended(self) -> float:
        """When the session function ended (seconds since the epoch)."""
        return self.started + self.seconds


def junit_file_name(session_name: str) -> str:
    """A file name for a session's junit XML: ``tests(package='accel')`` -> ``tests-package-accel.xml``."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", session_name).strip("-") + ".xml"


def save_record(folder: Path, entry: SessionTime) -> Path:
    """Write ``entry`` to ``folder/<session>.json`` (replacing an older record of that session)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (junit_file_name(entry.name).removesuffix(".xml") + ".json")
    staged = path.with_suffix(".json.tmp")
    staged.write_text(json.dumps(dataclasses.asdict(entry)))
    staged.replace(path)
    return path


def load_records(folder: Path, since: float) -> list[SessionTime]:
    """The records in ``folder`` of sessions started at or after ``since``, in starting order.

    Unreadable files are passed over (a session killed while writing leaves at worst a
    ``.tmp`` file, which is not read).
    """
    entries = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            fields = json.loads(path.read_text())
            tests = fields.pop("tests")
            entry = SessionTime(**fields, tests=None if tests is None else PytestCounts(**tests))
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if entry.started >= since:
            entries.append(entry)
    return sorted(entries, key=lambda entry: entry.started)


def setup_gap(previous: Sequence[SessionTime], started: float, run_started: float) -> float:
    """The setup time of a session starting at ``started``.

    That is the time since the newest end of a session in ``previous`` before it, or since
    ``run_started`` where none ended before it.
    """
    ends = [entry.ended for entry in previous if entry.ended <= started]
    return max(0.0, started - max([run_started, *ends]))


def read_junit_counts(path: Path) -> PytestCounts | None:
    """The counts of a pytest junit XML file; ``None`` where it is missing or unreadable."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in root.iter("testsuite"):
        for key in totals:
            try:
                totals[key] += int(suite.get(key, "0"))
            except ValueError:
                return None
    failed, errors, skipped = totals["failures"], totals["errors"], totals["skipped"]
    passed = max(0, totals["tests"] - failed - errors - skipped)
    return PytestCounts(passed=passed, failed=failed, skipped=skipped, errors=errors)


def format_table(times: Sequence[SessionTime], wall_seconds: float) -> str:
    """A fixed-width table of the sessions, a total line and the run's wall time.

    Args:
        times: The sessions, in the order they ran.
        wall_seconds: Wall time since the nox run started (under --parallel, less than the sessions' sum).

    Returns:
        The table's lines, joined by newlines (no trailing newline).
    """
    total_label = f"total ({len(times)} sessions)"
    name_width = max([len("session"), len(total_label), *(len(entry.name) for entry in times)])
    header = (
        f"{'session':<{name_width}}  {'result':<7}  {'setup s':>8}  {'session s':>9}  "
        f"{'cpu s':>7}  tests passed/failed/skipped"
    )
    rule = "-" * len(header)
    lines = ["CI session times (wall clock)", rule, header, rule]
    for entry in times:
        tests = "" if entry.tests is None else str(entry.tests)
        lines.append(
            f"{entry.name:<{name_width}}  {entry.result:<7}  {entry.setup_seconds:>8.1f}  "
            f"{entry.seconds:>9.1f}  {entry.cpu_seconds:>7.0f}  {tests}".rstrip()
        )
    counted = [entry.tests for entry in times if entry.tests is not None]
    total_tests = (
        str(
            PytestCounts(
                passed=sum(counts.passed for counts in counted),
                failed=sum(counts.failed for counts in counted),
                skipped=sum(counts.skipped for counts in counted),
                errors=sum(counts.errors for counts in counted),
            )
        )
        if counted
        else ""
    )
    setup_total = sum(entry.setup_seconds for entry in times)
    session_total = sum(entry.seconds for entry in times)
    cpu_total = sum(entry.cpu_seconds for entry in times)
    lines += [
        rule,
        f"{total_label:<{name_width}}  {'':<7}  {setup_total:>8.1f}  {session_total:>9.1f}  "
        f"{cpu_total:>7.0f}  {total_tests}".rstrip(),
        f"wall time since the nox run started: {wall_seconds:.1f} s",
    ]
    if wall_seconds > 0 and cpu_total > 0:
        lines.append(
            f"the sessions' CPU time is {cpu_total / wall_seconds:.2f} cores busy on average"
        )
    return "\n".join(lines)


def report(times: Sequence[SessionTime], wall_seconds: float) -> dict[str, Any]:
    """The table's data as a JSON-ready dict (seconds unrounded, tests ``null`` where unknown)."""
    return {
        "sessions": [dataclasses.asdict(entry) for entry in times],
        "total_session_seconds": sum(entry.seconds for entry in times),
        "total_setup_seconds": sum(entry.setup_seconds for entry in times),
        "total_cpu_seconds": sum(entry.cpu_seconds for entry in times),
        "wall_seconds": wall_seconds,
    }


def write_report(path: Path, times: Sequence[SessionTime], wall_seconds: float) -> None:
    """Write :func:`report` to ``path`` as indented JSON, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report(times, wall_seconds), indent=2) + "\n")
