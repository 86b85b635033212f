"""Run Hugging Face Accelerate 1.15's own unit tests against accel and against Accelerate itself.

Accelerate's sdist ships its unit suite (``tests/``). This runner downloads the pinned sdist once
(``pip download --no-deps --no-binary``, checked against its sha256, kept in
``~/.cache/accel-peer``), extracts ``tests/`` twice into a temporary folder, and runs pytest on
both copies on the CPU:

* **baseline**: the tests as shipped, in an interpreter with Accelerate installed
  (``--baseline-python``);
* **accel**: the same tests with ``accelerate`` renamed to ``accel`` only where it names a module
  (import statements, ``accelerate.x.y`` attribute chains, and strings that hold a dotted module
  path or an import line: ``mock.patch`` targets, ``assertLogs`` logger names), in this
  interpreter, which has accel installed.

Every test that passes on Accelerate must pass on accel, unless it is listed with ``--expect-fail
TEST_ID=REASON`` (the noxfile keeps that list, each entry with its reason). The last lines are a
summary: how many tests pass on Accelerate, how many of them pass on accel, the expected failures,
and every unexpected one. Nothing of Accelerate is kept in this repository. Only the standard
library is used::

    python scripts/peer_unit_tests.py --baseline-python /path/to/accelerate-venv/bin/python
    python scripts/peer_unit_tests.py --only test_data_loader.py    # accel only, no comparison

Accelerate is a fixed release, so its outcomes only change with the libraries around it: with
``--record FILE`` the baseline's outcomes are written to ``FILE`` with the versions of those
libraries (``scripts/peer_reference/``, by the non-CI ``peer_reference`` nox sessions), and with
``--baseline-outcomes FILE`` they are read from it instead of run, after checking that this
interpreter holds the recorded versions (else the run fails, naming the session to record them
again)::

    python scripts/peer_unit_tests.py --baseline-outcomes scripts/peer_reference/pinned.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import io
import json
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tokenize
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Mapping
from pathlib import Path

from peer_scripts import cache_dir, fetch_pinned, job_env

ACCELERATE_VERSION = "1.15.0"
SDIST_NAME = f"accelerate-{ACCELERATE_VERSION}.tar.gz"
# The sha256 of PyPI's file: a rerun uses the cached sdist only when it still matches.
SDIST_SHA256 = "5654f8c5eaa0d4fa68b33e287a97765da6849bf6d51dcac874e73fbbddfb6134"
TESTS_PREFIX = f"accelerate-{ACCELERATE_VERSION}/tests/"
# A test that hangs is stopped by pytest-timeout after this long; the whole run after SUITE_TIMEOUT_S.
TEST_TIMEOUT_S = 600
SUITE_TIMEOUT_S = 2400
PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"

# Strings that name a module: "accelerate.utils.launch.which", "import accelerate, accelerate.x".
_DOTTED_MODULE = re.compile(r"(?<![\w/.-])accelerate(?=(?:\.[A-Za-z_]\w*)+(?![\w/-]))")
_IMPORT_LINE = re.compile(r"\b(import|from)(\s+)accelerate\b")
_IMPORT_LIST = re.compile(r"(?<=,)(\s*)accelerate(?=[\s.,'\"]|$)")


# The distributions whose versions decide the baseline's outcomes (the peer venvs' pins):
# a record of Accelerate's outcomes holds them, and is replayed only where they are installed.
RECORDED_DISTRIBUTIONS = (
    "torch",
    "numpy",
    "pytest",
    "pytest-timeout",
    "pytest-subtests",
    "parameterized",
    "packaging",
    "psutil",
    "torchdata",
    "transformers",
    "datasets",
    "evaluate",
)
_ENVIRONMENT_SNIPPET = (
    "import importlib.metadata as m, json, platform, sys\n"
    "versions = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try: versions[name] = m.version(name)\n"
    "    except m.PackageNotFoundError: versions[name] = None\n"
    "print(json.dumps({'python': '.'.join(platform.python_version_tuple()[:2]), "
    "'libraries': versions}))\n"
)


def environment(python: str | None = None) -> dict[str, object]:
    """Python's version and :data:`RECORDED_DISTRIBUTIONS`' in ``python`` (default: this one)."""
    if python is None:
        versions: dict[str, str | None] = {}
        for name in RECORDED_DISTRIBUTIONS:
            try:
                versions[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                versions[name] = None
        return {"python": ".".join(platform.python_version_tuple()[:2]), "libraries": versions}
    printed = subprocess.run(
        [python, "-c", _ENVIRONMENT_SNIPPET, *RECORDED_DISTRIBUTIONS],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    recorded: dict[str, object] = json.loads(printed)
    return recorded


def recorded_outcomes(path: Path, session: str) -> dict[str, str]:
    """The baseline outcomes recorded in ``path``, if they were recorded with this environment.

    Raises:
        SystemExit: No record, or one made with other versions; the message names ``session``,
            the nox session that records it again.
    """
    if not path.is_file():
        raise SystemExit(f"peer unit: no recorded Accelerate outcomes at {path}: run {session}")
    record = json.loads(path.read_text())
    here = environment()
    if record["environment"] != here:
        theirs, ours = record["environment"], here
        lines = [
            f"{name}: recorded {theirs['libraries'].get(name)}, installed {version}"
            for name, version in ours["libraries"].items()  # type: ignore[attr-defined]
            if theirs["libraries"].get(name) != version
        ]
        if theirs["python"] != ours["python"]:
            lines.append(f"python: recorded {theirs['python']}, installed {ours['python']}")
        raise SystemExit(
            f"peer unit: the recorded Accelerate outcomes ({path}) were made with other versions "
            "than this venv holds:\n  " + "\n  ".join(lines) + f"\nrun {session} to record "
            "them again, and commit the file"
        )
    outcomes: dict[str, str] = record["outcomes"]
    return outcomes


def write_outcomes(path: Path, outcomes: Mapping[str, str], baseline_python: str) -> None:
    """Record the baseline's ``outcomes`` in ``path``, with ``baseline_python``'s versions."""
    record = {
        "note": f"Accelerate {ACCELERATE_VERSION}'s own unit suite on the CPU, outcome per test",
        "environment": environment(baseline_python),
        "outcomes": dict(sorted(outcomes.items())),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"peer unit: recorded {len(outcomes)} outcomes of Accelerate's suite in {path}")


def fetch_sdist(folder: Path) -> Path:
    """The pinned Accelerate sdist (see :func:`peer_scripts.fetch_pinned`)."""
    return fetch_pinned(folder, SDIST_NAME, SDIST_SHA256, "sdist")


def _rename_string(literal: str) -> str:
    literal = _DOTTED_MODULE.sub("accel", literal)
    if _IMPORT_LINE.search(literal):
        literal = _IMPORT_LINE.sub(r"\1\2accel", literal)
        literal = _IMPORT_LIST.sub(r"\1accel", literal)
    return literal


def rename_module_references(source: str) -> str:
    """``accelerate`` -> ``accel`` where it names a module, nothing else.

    Renamed: the name in ``import``/``from`` statements and at the head of an attribute chain
    (``accelerate.utils.x``), and inside string literals a dotted module path
    (``"accelerate.utils.launch.which"``) or an import line (``"import accelerate"``). Left alone:
    attributes (``self.accelerate``), other identifiers (``path_in_accelerate_package``), words in
    prose and paths (``"pip install accelerate"``, ``".cache/huggingface/accelerate"``).
    """
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    renamed = []
    for index, token in enumerate(tokens):
        if token.type == tokenize.NAME and token.string == "accelerate":
            before = tokens[index - 1].string if index else ""
            after = tokens[index + 1].string if index + 1 < len(tokens) else ""
            if before != "." and (before in ("import", "from", ",") or after == "."):
                token = token._replace(string="accel")
        elif token.type == tokenize.STRING:
            token = token._replace(string=_rename_string(token.string))
        renamed.append(token)
    return tokenize.untokenize(renamed)


def extract_tests(sdist: Path, destination: Path, *, rename: bool) -> Path:
    """Write the sdist's ``tests/`` below ``destination`` (renamed when asked); return its root.

    The root holds ``tests/``, as Accelerate's checkout does, so relative paths in the tests
    (``tests/test_configs/...``) mean the same thing.
    """
    root = destination / ("accel" if rename else "accelerate")
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            if not member.isfile() or not member.name.startswith(TESTS_PREFIX):
                continue
            target = root / "tests" / member.name[len(TESTS_PREFIX) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            handle = archive.extractfile(member)
            assert handle is not None, f"{member.name} is a file without content"
            data = handle.read()
            if rename and target.suffix == ".py":
                data = rename_module_references(data.decode("utf-8")).encode("utf-8")
            target.write_bytes(data)
    return root


def test_id(classname: str, name: str) -> str:
    """``tests.test_x.Class`` + ``test_y`` -> ``test_x.py::Class::test_y``."""
    parts = classname.split(".")
    if parts and parts[0] == "tests":
        parts = parts[1:]
    module, classes = (parts[0], parts[1:]) if parts else ("?", [])
    return "::".join([f"{module}.py", *classes, name])


def read_junit(path: Path) -> dict[str, str]:
    """Each test's outcome (passed, failed or skipped) from a pytest junit XML file."""
    outcomes: dict[str, str] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        identifier = test_id(case.get("classname", ""), case.get("name", ""))
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            outcome = FAILED
        elif "skipped" in tags:
            outcome = SKIPPED
        else:
            outcome = PASSED
        # A test that passed and then failed in teardown appears twice: the failure wins.
        if outcomes.get(identifier) != FAILED:
            outcomes[identifier] = outcome
    return outcomes


def run_suite(
    python: str, root: Path, only: Iterable[str], label: str, pytest_args: Iterable[str]
) -> dict[str, str]:
    """Run pytest on ``root/tests`` with ``python``; return each test's outcome."""
    junit = root / "junit.xml"
    targets = [f"tests/{name}" for name in only] or ["tests"]
    command = [
        python,
        "-m",
        "pytest",
        *targets,
        "-p",
        "no:cacheprovider",
        "--continue-on-collection-errors",
        "-q",
        "-rfE",
        f"--timeout={TEST_TIMEOUT_S}",
        f"--junitxml={junit}",
        *pytest_args,
    ]
    print(f"peer unit: {label}: {' '.join(command)}", flush=True)
    try:
        subprocess.run(
            command,
            cwd=root,
            env=job_env(root / "hf_home", {}),
            stdin=subprocess.DEVNULL,
            timeout=SUITE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SystemExit(f"peer unit: {label}: the suite ran past {SUITE_TIMEOUT_S} s") from None
    if not junit.is_file():
        raise SystemExit(f"peer unit: {label}: pytest wrote no report ({junit})")
    return read_junit(junit)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Accel's outcomes measured against the tests that pass on Accelerate."""

    baseline_passing: list[str]
    passing_on_accel: list[str]
    expected_failures: dict[str, str]
    unexpected: list[str]
    stale_expectations: list[str]

    @property
    def share(self) -> float:
        """The fraction of Accelerate's passing tests that pass on accel."""
        return len(self.passing_on_accel) / max(1, len(self.baseline_passing))


def compare(
    baseline: Mapping[str, str], accel: Mapping[str, str], expected: Mapping[str, str]
) -> Comparison:
    """Which of Accelerate's passing tests fail on accel, split into expected and unexpected."""
    passing = sorted(name for name, outcome in baseline.items() if outcome == PASSED)
    on_accel = [name for name in passing if accel.get(name) == PASSED]
    failing = [name for name in passing if accel.get(name) != PASSED]
    return Comparison(
        baseline_passing=passing,
        passing_on_accel=on_accel,
        expected_failures={name: expected[name] for name in failing if name in expected},
        unexpected=[name for name in failing if name not in expected],
        # An entry whose test passes on accel (or no longer passes on Accelerate) is stale.
        stale_expectations=sorted(name for name in expected if name not in failing),
    )


def summarise(result: Comparison, accel: Mapping[str, str]) -> None:
    """Print the comparison: counts, expected failures with reasons, unexpected ones."""
    for name, reason in result.expected_failures.items():
        print(f"peer unit: expected failure: {name} ({reason})")
    for name in result.stale_expectations:
        print(f"peer unit: STALE expected failure (passes on accel, or not on Accelerate): {name}")
    for name in result.unexpected:
        print(
            f"peer unit: UNEXPECTED: {name} passes on Accelerate, {accel.get(name, 'absent')} on accel"
        )
    print(
        f"peer unit summary: {len(result.baseline_passing)} tests pass on Accelerate "
        f"{ACCELERATE_VERSION}; {len(result.passing_on_accel)} of them pass on accel "
        f"({100 * result.share:.1f}%); {len(result.expected_failures)} expected failures; "
        f"{len(result.unexpected)} unexpected; {len(result.stale_expectations)} stale expectations"
    )
    print(
        f"peer unit: {len(result.passing_on_accel)} passed, "
        f"{len(result.baseline_passing) - len(result.passing_on_accel)} failed"
    )


def parse_expectations(entries: Iterable[str]) -> dict[str, str]:
    """``TEST_ID=REASON`` arguments as a mapping; a missing reason is refused."""
    expected = {}
    for entry in entries:
        name, separator, reason = entry.partition("=")
        if not separator or not reason.strip():
            raise SystemExit(f"peer unit: --expect-fail {entry!r}: write TEST_ID=REASON")
        expected[name.strip()] = reason.strip()
    return expected


def main(argv: list[str] | None = None) -> int:
    """Fetch, extract, run both suites, compare; 0 when nothing unexpected failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline-python",
        help="an interpreter with Accelerate installed; without it only accel runs",
    )
    parser.add_argument("--only", nargs="+", default=[], metavar="FILE", help="test files to run")
    parser.add_argument("--expect-fail", action="append", default=[], metavar="TEST_ID=REASON")
    parser.add_argument(
        "--baseline-outcomes",
        type=Path,
        help="read Accelerate's outcomes from this record (see --record) instead of running it",
    )
    parser.add_argument(
        "--record",
        type=Path,
        help="with --baseline-python: write Accelerate's outcomes and versions here",
    )
    parser.add_argument(
        "--record-session",
        default="the peer_reference nox session",
        help="what records the outcomes again (named when a record does not fit)",
    )
    parser.add_argument("--results", type=Path, help="write both runs' outcomes here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.record and not args.baseline_python:
        parser.error("--record writes Accelerate's outcomes: give --baseline-python too")
    if args.baseline_outcomes and args.baseline_python:
        parser.error("--baseline-outcomes replaces --baseline-python: give one of them")
    if (args.record or args.baseline_outcomes) and (args.only or args.pytest_args):
        parser.error("a record holds the whole suite: no --only or pytest arguments with it")
    expected = parse_expectations(args.expect_fail)
    recorded: dict[str, str] | None = None
    if args.baseline_outcomes:
        recorded = recorded_outcomes(args.baseline_outcomes, args.record_session)
    compared = bool(args.baseline_python) or recorded is not None
    sdist = fetch_sdist(cache_dir())
    work = Path(tempfile.mkdtemp(prefix="accel_peer_unit_"))
    flaky: list[str] = []
    try:
        accel_root = extract_tests(sdist, work, rename=True)
        accel = run_suite(sys.executable, accel_root, args.only, "accel", args.pytest_args)
        baseline: dict[str, str] = recorded or {}
        if args.baseline_python:
            root = extract_tests(sdist, work, rename=False)
            baseline = run_suite(
                args.baseline_python, root, args.only, "accelerate", args.pytest_args
            )
            if args.record:
                write_outcomes(args.record, baseline, args.baseline_python)
        if compared:
            first = compare(baseline, accel, expected)
            if first.unexpected:
                accel, flaky = rerun_alone(accel_root, accel, first.unexpected, args.pytest_args)
        if args.results:
            args.results.write_text(json.dumps({"accel": accel, "accelerate": baseline}, indent=1))
    finally:
        if args.keep:
            print(f"peer unit: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if not compared:
        counts = {o: sum(v == o for v in accel.values()) for o in (PASSED, FAILED, SKIPPED)}
        print(f"peer unit: accel only: {counts}")
        return 1 if counts[FAILED] else 0
    result = compare(baseline, accel, expected)
    for name in flaky:
        print(
            f"peer unit: FLAKY: {name} failed in the suite and passed when run again alone "
            "(it measures something machine-wide, or depends on the tests before it)"
        )
    summarise(result, accel)
    return 1 if result.unexpected or result.stale_expectations else 0


def rerun_alone(
    root: Path, accel: Mapping[str, str], names: Iterable[str], pytest_args: Iterable[str]
) -> tuple[dict[str, str], list[str]]:
    """Run each unexpected failure once more, by itself; return the outcomes and the flaky ones.

    Some of Accelerate's tests measure the whole machine (free host memory before and after a
    step), which another CI session running beside this one changes. A test that fails again
    alone is a real failure and stays one; a test that passes alone is reported as flaky.
    """
    outcomes = dict(accel)
    flaky = []
    for name in names:
        again = run_suite(sys.executable, root, [name], f"accel, {name} again", pytest_args)
        if again.get(name) == PASSED:
            outcomes[name] = PASSED
            flaky.append(name)
    return outcomes, flaky


if __name__ == "__main__":
    sys.exit(main())
