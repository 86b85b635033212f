"""Accelerate 1.15.0's side of the ecosystem jobs, recorded once and replayed in CI.

Accelerate is a fixed release, so what its jobs log (losses, grad norms, metrics, device maps,
outputs, the names the libraries reached) only changes when the libraries around it do. The
``ecosystem_reference`` nox session runs every job on Accelerate in a venv of its own and writes
the results, with the versions and the machine they were recorded on, to :data:`RESULTS_FILE`;
the ``ecosystem`` session compares accel's live results with those, under the same tolerances.

Run as a script (in the venv whose libraries are meant):

* ``python reference.py environment``: this venv's libraries and machine, as JSON;
* ``python reference.py check``: ``replay`` when the record fits this venv, ``live`` when only
  the machine differs (the session then runs Accelerate's side itself), else exit 1 naming the
  session that records it again;
* ``python reference.py diff OLD NEW``: how two records' results differ (exit 1 if they do);
* ``python reference.py repeat RECORD OUT BASELINE_PYTHON``: run every job of ``RECORD`` on
  Accelerate again (in ``BASELINE_PYTHON``) and write the results to ``OUT``, to show the
  record is reproducible (``ecosystem_reference`` does, and diffs the two).
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS_FILE = HERE / "reference" / "accelerate-1.15.0.json"
#: The session that records :data:`RESULTS_FILE` again.
RECORD_SESSION = "nox -s ecosystem_reference"
#: The distributions whose versions a record holds: a job's numbers may change with any of them.
LIBRARIES = (
    "torch",
    "transformers",
    "peft",
    "trl",
    "datasets",
    "deepspeed",
    "bitsandbytes",
    "accelerate",
    "safetensors",
    "tokenizers",
    "numpy",
)
#: What the machine contributes: torch's CPU kernels differ by instruction set.
MACHINE_KEYS = ("cpu_capability",)


class ReferenceMismatch(Exception):
    """The record does not fit the installed libraries (or has no result for a job)."""


def environment() -> dict[str, Any]:
    """The installed libraries' versions, Python's and the CPU kernels torch picks."""
    import torch

    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": ".".join(platform.python_version_tuple()[:2]),
        "libraries": versions,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def differences(recorded: dict[str, Any], installed: dict[str, Any]) -> tuple[list[str], list[str]]:
    """What differs between two environments: (library and Python lines, machine lines)."""
    software = [
        f"{name}: recorded {recorded['libraries'].get(name)}, installed {version}"
        for name, version in installed["libraries"].items()
        if recorded["libraries"].get(name) != version
    ]
    if recorded["python"] != installed["python"]:
        software.append(f"python: recorded {recorded['python']}, installed {installed['python']}")
    machine = [
        f"{key}: recorded {recorded[key]}, here {installed[key]}"
        for key in MACHINE_KEYS
        if recorded[key] != installed[key]
    ]
    return software, machine


def job_key(script: str, args: tuple[str, ...], processes: int, flags: tuple[str, ...]) -> str:
    """The record's name for a job (the job runner's own key, less the target)."""
    return json.dumps([script, list(args), processes, list(flags)])


def load(path: Path = RESULTS_FILE) -> dict[str, Any]:
    """The record at ``path``; a clear error naming the session when there is none."""
    if not path.exists():
        raise ReferenceMismatch(
            f"no recorded Accelerate results at {path}: run `{RECORD_SESSION}` to record them"
        )
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def check_fits(record: dict[str, Any], installed: dict[str, Any]) -> list[str]:
    """The machine differences (empty when the record fits); raises on library differences."""
    software, machine = differences(record["environment"], installed)
    if software:
        raise ReferenceMismatch(
            "the recorded Accelerate results (tests-integration/ecosystem/reference/) were made "
            "with other library versions than this venv holds:\n  "
            + "\n  ".join(software)
            + f"\nrun `{RECORD_SESSION}` to record them again with these versions, and commit "
            "the new file"
        )
    return machine


def replayed(record: dict[str, Any], key: str) -> dict[str, Any]:
    """The recorded result of job ``key``; a clear error naming the session when absent."""
    results: dict[str, dict[str, Any]] = record["results"]
    if key not in results:
        raise ReferenceMismatch(
            f"no recorded Accelerate result for the job {key}: run `{RECORD_SESSION}` to "
            "record every job again"
        )
    return dict(results[key])


def _leaves(value: Any, where: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for key, item in value.items():
            found.update(_leaves(item, f"{where}.{key}"))
        return found
    if isinstance(value, list):
        found = {}
        for index, item in enumerate(value):
            found.update(_leaves(item, f"{where}[{index}]"))
        return found
    return {where: value}


def compare_records(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Lines naming each job whose results differ, with the largest numeric difference."""
    lines = []
    for key in sorted(set(old["results"]) | set(new["results"])):
        if key not in old["results"] or key not in new["results"]:
            lines.append(f"{key}: only in {'new' if key in new['results'] else 'old'} record")
            continue
        before, after = _leaves(old["results"][key]), _leaves(new["results"][key])
        largest, other = 0.0, []
        for leaf in sorted(set(before) | set(after)):
            a, b = before.get(leaf), after.get(leaf)
            numbers = all(isinstance(x, (int, float)) for x in (a, b))
            if numbers and not any(word in leaf for word in ("runtime", "per_second")):
                largest = max(largest, abs(float(a) - float(b)))  # type: ignore[arg-type]
            elif not numbers and a != b:
                other.append(leaf)
        if largest or other:
            lines.append(f"{key}: largest difference {largest:.3g}, other changes {other[:5]}")
    return lines


def repeat(record_file: Path, out: Path, baseline_python: str) -> int:
    """Run every job of the record at ``record_file`` on Accelerate again; write them to ``out``.

    Returns:
        How many jobs ran.
    """
    import tempfile

    from ecosystem_jobs import JobRunner

    record = load(record_file)
    with tempfile.TemporaryDirectory(prefix="ecosystem-repeat-") as folder:
        runner = JobRunner(Path(folder), baseline_python=baseline_python, record_file=out)
        for key in record["results"]:
            script, args, processes, flags = json.loads(key)
            args = [arg.replace("{root}", folder) for arg in args]
            runner.run("accelerate", script, *args, processes=processes, flags=tuple(flags))
        return runner.write_record(record["environment"])


def main(argv: list[str]) -> int:
    """The command line (see the module docstring)."""
    command = argv[0] if argv else ""
    if command == "environment":
        print(json.dumps(environment(), indent=1))
        return 0
    if command == "check":
        try:
            machine = check_fits(load(), environment())
        except ReferenceMismatch as error:
            print(f"ecosystem reference: {error}", file=sys.stderr)
            return 1
        if machine:
            print("ecosystem reference: recorded on another machine (" + "; ".join(machine) + ")")
        print("live" if machine else "replay")
        return 0
    if command == "diff" and len(argv) == 3:
        old, new = (load(Path(name)) for name in argv[1:])
        lines = compare_records(old, new)
        jobs = len(new["results"])
        print("\n".join(lines) or f"ecosystem reference: all {jobs} jobs' results are identical")
        return 1 if lines else 0
    if command == "repeat" and len(argv) == 4:
        count = repeat(Path(argv[1]), Path(argv[2]), argv[3])
        print(f"ecosystem reference: ran {count} jobs on Accelerate again into {argv[2]}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
