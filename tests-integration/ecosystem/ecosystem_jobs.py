"""Run the same Hugging Face job on accel and on real Accelerate, and compare what they logged.

The ``ecosystem`` nox session installs transformers, PEFT and TRL (pinned) beside accel, and
makes a second venv with Accelerate 1.15.0 whose interpreter it names in
``ACCEL_ECOSYSTEM_BASELINE_PYTHON``. Jobs run once per session and are shared between tests
(:class:`JobRunner`): a Trainer launch costs 10-20 s here.

Accelerate's side is a fixed release: without a venv to run it in, its results come from the record
in ``reference/`` (reference.py), made by the ``ecosystem_reference`` session, which sets
``ACCEL_ECOSYSTEM_RECORD`` to the file to write.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import reference
from accelerate_names import imported_names, write_sites
from name_use_recorder import SITES_ENV, used_names

HERE = Path(__file__).parent
BASELINE_PYTHON_ENV = "ACCEL_ECOSYSTEM_BASELINE_PYTHON"
RECORD_ENV = "ACCEL_ECOSYSTEM_RECORD"
#: Logged values that measure time, not training: never compared.
_TIMING_WORDS = ("runtime", "per_second")
JOB_TIMEOUT = 600


def require_libraries() -> None:
    """Skip the calling module unless transformers, PEFT and TRL are importable here."""
    for name in ("transformers", "peft", "trl"):
        pytest.importorskip(name, reason=f"{name} is not installed (run `nox -s ecosystem`)")


def job_env(tmp: Path) -> dict[str, str]:
    """A clean environment for a launched job: no launcher variables, no hub, one thread."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ACCEL_", "ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))
    }
    env.update(
        HF_HOME=str(tmp / "hf_home"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        CUDA_VISIBLE_DEVICES="",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


class JobRunner:
    """Runs each distinct job once (on ``accel`` or ``accelerate``) and keeps its result.

    Args:
        root: Where the jobs' folders go.
        baseline_python: An interpreter with Accelerate installed, to run its side live; without
            one, its side is replayed from ``record_file``.
        record_file: The record to replay from; with ``baseline_python``, the file to write
            Accelerate's live results to (:meth:`write_record`).
    """

    def __init__(
        self,
        root: Path,
        baseline_python: str | None = None,
        record_file: Path = reference.RESULTS_FILE,
    ) -> None:
        self.root = root
        self.baseline_python = baseline_python
        self.record_file = record_file
        self._results: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._record: dict[str, Any] | None = None
        self._recorded: dict[str, dict[str, Any]] = {}
        # Every job records which Accelerate names the libraries' code reached (test_names.py).
        self.name_sites = root / "accelerate_name_sites.json"
        write_sites(self.name_sites, imported_names())

    def command(
        self,
        target: str,
        script: str,
        args: tuple[str, ...],
        processes: int,
        flags: tuple[str, ...],
        out: Path,
    ) -> list[str]:
        """The command line that runs ``script`` on ``target`` with ``processes`` processes."""
        script_path = str(HERE / script)
        if target == "accel":
            if processes == 1 and not flags:
                return [sys.executable, "-m", "accel.as_accelerate", script_path, str(out), *args]
            accel = str(Path(sys.executable).with_name("accel"))
            launch = [
                accel,
                "launch",
                "--as_accelerate",
                "--cpu",
                "--num_processes",
                str(processes),
            ]
            return [*launch, *flags, script_path, str(out), *args]
        python = self.baseline_python
        assert python, "Accelerate's side runs live only with baseline_python"
        if processes == 1 and not flags:
            return [python, script_path, str(out), *args]
        launch = [python, "-m", "accelerate.commands.launch", "--num_processes", str(processes)]
        # Accelerate runs several CPU processes through its multi-GPU launcher (torchrun) when no
        # GPU is visible; --cpu would start one process whatever --num_processes says.
        return [*launch, "--multi_gpu", *flags, script_path, str(out), *args]

    def run(
        self,
        target: str,
        script: str,
        *args: str,
        processes: int = 2,
        flags: tuple[str, ...] = (),
        timeout: float = JOB_TIMEOUT,
    ) -> dict[str, Any]:
        """The ``result.json`` of the job (run now unless an identical job already ran).

        The result also holds ``_out``, the job's output folder (its checkpoints and saves), and
        ``_names_used``, the Accelerate names the libraries' code reached in any of its processes.
        """
        key = (target, script, args, processes, flags)
        if key not in self._results and target == "accelerate" and not self.baseline_python:
            self._results[key] = self._replay(script, args, processes, flags)
        if key not in self._results:
            out = self.root / f"job{len(self._results)}-{target}"
            out.mkdir(parents=True)
            command = self.command(target, script, args, processes, flags, out)
            completed = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**job_env(out), SITES_ENV: str(self.name_sites)},
                cwd=out,
                check=False,
                start_new_session=True,
            )
            if completed.returncode != 0:
                pytest.fail(
                    f"{' '.join(command)} exited {completed.returncode}\n--- stdout ---\n"
                    f"{completed.stdout[-6000:]}\n--- stderr ---\n{completed.stderr[-12000:]}"
                )
            result = json.loads((out / "result.json").read_text())
            result["_out"] = str(out)
            result["_names_used"] = sorted(used_names(out))
            self._results[key] = result
            if target == "accelerate":
                name = reference.job_key(script, self._relative(args), processes, flags)
                self._recorded[name] = {k: v for k, v in result.items() if k != "_out"}
        return self._results[key]

    def _relative(self, args: tuple[str, ...]) -> tuple[str, ...]:
        """``args`` with this session's folder written as ``{root}`` (the same in every run)."""
        return tuple(arg.replace(str(self.root), "{root}") for arg in args)

    def _replay(
        self, script: str, args: tuple[str, ...], processes: int, flags: tuple[str, ...]
    ) -> dict[str, Any]:
        """Accelerate's recorded result for the job (no ``_out``: its files were not kept)."""
        try:
            if self._record is None:
                record = reference.load(self.record_file)
                machine = reference.check_fits(record, reference.environment())
                if machine:
                    raise reference.ReferenceMismatch(
                        "the record was made on another machine ("
                        + "; ".join(machine)
                        + f"): set {BASELINE_PYTHON_ENV} to run Accelerate's side here (the "
                        "ecosystem session does)"
                    )
                self._record = record
            key = reference.job_key(script, self._relative(args), processes, flags)
            return reference.replayed(self._record, key)
        except reference.ReferenceMismatch as error:
            pytest.fail(str(error))

    def write_record(self, environment: dict[str, Any]) -> int:
        """Write Accelerate's live results of this session, recorded in ``environment``.

        Returns:
            How many jobs were written.
        """
        record = {
            "note": f"Accelerate 1.15.0's results of the ecosystem jobs: `{reference.RECORD_SESSION}`",
            "environment": environment,
            "results": dict(sorted(self._recorded.items())),
        }
        self.record_file.parent.mkdir(parents=True, exist_ok=True)
        self.record_file.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return len(self._recorded)


def _numbers(record: dict[str, Any], ignore: tuple[str, ...]) -> dict[str, float]:
    return {
        key: float(value)
        for key, value in record.items()
        if isinstance(value, (int, float))
        and not any(word in key for word in _TIMING_WORDS)
        and key not in ignore
    }


def assert_same_history(
    mine: list[dict[str, Any]],
    theirs: list[dict[str, Any]],
    tolerance: float,
    ignore: tuple[str, ...] = (),
) -> int:
    """Every logged value (losses, grad norms, eval metrics, steps) agrees within ``tolerance``.

    Args:
        mine: accel's ``log_history``.
        theirs: The reference's.
        tolerance: Largest absolute difference allowed.
        ignore: Keys left out (say why where a test passes any).

    Returns:
        How many values were compared.
    """
    assert len(mine) == len(theirs), f"{len(mine)} log records against {len(theirs)}"
    compared = 0
    for index, (ours, other) in enumerate(zip(mine, theirs, strict=True)):
        ours_numbers, other_numbers = _numbers(ours, ignore), _numbers(other, ignore)
        assert ours_numbers.keys() == other_numbers.keys(), f"record {index}: {ours} vs {other}"
        for key, value in ours_numbers.items():
            expected = other_numbers[key]
            assert math.isclose(value, expected, rel_tol=0, abs_tol=tolerance), (
                f"record {index} {key}: {value} against {expected} (tolerance {tolerance})"
            )
            compared += 1
    assert compared > 0
    return compared
