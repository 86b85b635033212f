"""Run Hugging Face Accelerate's own distributed test scripts against accel (``nox -s peer``).

Accelerate ships its distributed test scripts inside its wheel (``accelerate/test_utils/scripts/``
and ``external_deps/``). This runner downloads the pinned wheel once (``pip download --no-deps``,
checked against its sha256, kept in ``~/.cache/accel-peer``), copies the scripts into a temporary
folder with ``accelerate`` renamed to ``accel`` (a plain word rename, nothing else changed), checks
that every name they import exists in accel, and runs each one the way Accelerate's own test suite
runs it (``tests/test_multidevice.py``, ``test_grad_sync.py``, ``test_cli.py``, ``test_metrics.py``,
``test_kwargs_handlers.py``), on 1 and 2 CPU processes. Nothing of Accelerate is kept in this
repository.

A script that cannot run on a CPU machine without downloads or GPUs is listed with that reason.
The last lines are a summary of every script x process count (pass, skipped with the reason, or an
expected difference, each of which is in docs/accelerate.md's "deliberately differs" list) and
a count line. The exit code is 1 when any outcome is not the expected one.

``--target accelerate`` runs the same scripts, unrenamed, on Accelerate itself (``nox -s
peer_baseline``, in a venv of its own) and compares with :data:`ACCELERATE_BASELINE`, what they do
on this 2-core CPU machine. Only the standard library is used, so either venv can run it::

    python scripts/peer_scripts.py                          # accel
    python scripts/peer_scripts.py --target accelerate      # Accelerate 1.15.0 itself
    python scripts/peer_scripts.py --only test_ops.py --processes 2
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import hashlib
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIFFERENCES_PAGE = ROOT / "docs" / "accelerate.md"
DIFFERS_HEADING = "## Where accel deliberately differs from Accelerate"
ACCELERATE_VERSION = "1.15.0"
WHEEL_NAME = f"accelerate-{ACCELERATE_VERSION}-py3-none-any.whl"
# The sha256 of PyPI's file: a rerun uses the cached wheel only when it still matches.
WHEEL_SHA256 = "97eacca0b73e45cb867dbf8c5d5d4dc32219544300e0c8992c7334dc2ef33cec"
SCRIPTS_PREFIX = "accelerate/test_utils/scripts/"
PROCESS_COUNTS = (1, 2)
RUN_TIMEOUT_S = 300
OUTPUT_TAIL_LINES = 60

PASS = "pass"
FAIL = "fail"
SKIPPED = "skipped"
EXPECTED_DIFFERENCE = "expected-difference"

_DOWNLOADS_GLUE = "downloads bert-base-cased and GLUE/MRPC from the Hub"


@dataclasses.dataclass(frozen=True)
class PeerScript:
    """One shipped script and how Accelerate's test suite runs it.

    Attributes:
        path: Path below ``accelerate/test_utils/scripts/``.
        how: ``"launch"`` (``accel launch`` / ``accelerate launch``) or ``"python"`` (a plain
            interpreter that starts its own processes; the count goes in
            ``ACCELERATE_NUM_PROCESSES``).
        flags: Extra launcher flags Accelerate's test passes.
        env: Extra environment variables Accelerate's test sets.
        skip: Why it cannot run on a CPU machine without downloads or GPUs (every count).
        skip_counts: The same, for one process count only.
        differs: Per process count, a deliberate difference that makes accel fail the script:
            the docs/accelerate.md entry's opening words and a text the failure's output must
            contain (any other failure is unexpected).
        racy: Per process count, why the script's own outcome depends on process scheduling; a
            failed run is printed in full and run once more, and the summary says so.
    """

    path: str
    how: str = "launch"
    flags: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    skip: str | None = None
    skip_counts: Mapping[int, str] = dataclasses.field(default_factory=dict)
    differs: Mapping[int, tuple[str, str]] = dataclasses.field(default_factory=dict)
    racy: Mapping[int, str] = dataclasses.field(default_factory=dict)

    def skip_reason(self, processes: int) -> str | None:
        """Why this script does not run on ``processes`` processes here, or None."""
        return self.skip or self.skip_counts.get(processes)


SCRIPTS: tuple[PeerScript, ...] = (
    # tests/test_cli.py::test_no_config launches it with --monitor_interval 0.1.
    PeerScript("test_cli.py", flags=("--monitor_interval", "0.1")),
    # tests/test_multidevice.py runs these through DEFAULT_LAUNCH_COMMAND.
    PeerScript("test_script.py"),
    PeerScript("test_ops.py"),
    PeerScript(
        "test_distributed_data_loop.py",
        skip_counts={1: "asserts 2 processes; Accelerate's suite runs it on 2 only"},
    ),
    PeerScript("test_merge_weights.py"),
    # tests/test_grad_sync.py.
    PeerScript("test_sync.py"),
    # tests/test_cli.py::test_notebook_launcher: `python test_notebook.py`, processes in the env.
    PeerScript(
        "test_notebook.py",
        how="python",
        skip_counts={
            1: "its main() runs 2-process checks (skip marks act under pytest only); "
            "Accelerate's suite runs it on 2 only"
        },
        # test_fault_tolerant: how many queue items a restart round uses depends on whether the
        # second worker takes one before torch elastic tears the round down. When each round
        # takes one, the last round has one worker start a PartialState while its peer found
        # the queue empty and returned; accel ends that worker at once (_notebook_peers.py) and
        # the restarts are spent. Seen once in ~12 runs on a loaded CI machine.
        racy={2: "test_fault_tolerant's restart rounds race for its queue"},
    ),
    # tests/test_kwargs_handlers.py::test_ddp_comm_hook.
    PeerScript(
        "test_ddp_comm_hook.py",
        skip="GPU-only: torch refuses its reference DistributedDataParallel(device_ids=...) for "
        "CPU modules",
    ),
    # tests/test_metrics.py (needs transformers, datasets and evaluate installed; on a CPU it
    # runs only the gather_for_metrics checks on generated data: its MRPC part is GPU-only).
    PeerScript("external_deps/test_metrics.py", env={"ACCELERATE_LOG_LEVEL": "INFO"}),
    PeerScript("external_deps/test_checkpointing.py", skip=_DOWNLOADS_GLUE),
    PeerScript("external_deps/test_performance.py", skip=_DOWNLOADS_GLUE),
    PeerScript("external_deps/test_peak_memory_usage.py", skip=_DOWNLOADS_GLUE),
    PeerScript(
        "external_deps/test_ds_multiple_model.py",
        skip=_DOWNLOADS_GLUE,
    ),
    PeerScript(
        "external_deps/test_ds_alst_ulysses_sp.py",
        skip="downloads a Llama model from the Hub; Ulysses sequence parallelism needs GPUs",
    ),
    PeerScript(
        "external_deps/test_pippy.py",
        skip="GPU-only (prints 'Less than two GPUs found' on a CPU); Accelerate's suite skips it",
    ),
    PeerScript(
        "external_deps/test_zero3_integration.py",
        skip="downloads sshleifer/tiny-gpt2 from the Hub; starts an NCCL (GPU) group",
    ),
)

# What the scripts do with Accelerate 1.15.0 itself on this machine (2 cores, no GPU, torch 2.13),
# measured with `nox -s peer_baseline`. Skipped scripts are not run; everything else passes.
ACCELERATE_BASELINE: dict[tuple[str, int], str] = {
    # Its MULTI_CPU join_uneven_inputs is a no-op ("only supported for multi-GPU"), so the DDP
    # backward of test_can_join_uneven_inputs waits for the rank that ran out of batches.
    ("test_distributed_data_loop.py", 2): FAIL,
    # Its FSDP on a CPU: KeyError: None while preparing (its own FSDP asks for a GPU).
    ("test_merge_weights.py", 2): FAIL,
    # test_fault_tolerant: the restarted worker that takes the last item makes a PartialState,
    # whose gloo group waits for the peer that already returned (see _notebook_peers.py).
    ("test_notebook.py", 2): FAIL,
}

# Names the skipped scripts import that accel does not have yet, and the work that adds them.
# Anything else a script imports must exist in accel, or the run fails.
IMPORTS_PLANNED: dict[str, str] = {}

# Launcher variables of an enclosing job: a launched script must not think it is a worker of it.
_LAUNCHER_VARIABLES = re.compile(
    r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|ROLE_RANK|ROLE_WORLD_SIZE|"
    r"MASTER_ADDR|MASTER_PORT|TORCHELASTIC_.*|ACCELERATE_.*|ACCEL_.*|FSDP_.*|PMI_.*|OMPI_.*|"
    r"SLURM_.*)$"
)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one script x process count did."""

    script: PeerScript
    processes: int
    status: str
    detail: str = ""
    seconds: float = 0.0

    @property
    def label(self) -> str:
        """``status`` with its reason, as the summary line shows it."""
        if self.status in (SKIPPED, EXPECTED_DIFFERENCE) or (self.status == PASS and self.detail):
            return f"{self.status}({self.detail})"
        return self.status


def cache_dir() -> Path:
    """Where the wheel is kept between runs (``$ACCEL_PEER_CACHE``, else ``~/.cache/accel-peer``)."""
    return Path(os.environ.get("ACCEL_PEER_CACHE", Path.home() / ".cache" / "accel-peer"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_pinned(folder: Path, name: str, sha256: str, kind: str) -> Path:
    """A pinned Accelerate file from the cache, else ``pip download --no-deps`` into it.

    Args:
        folder: The cache folder.
        name: The file's name (wheel or sdist).
        sha256: PyPI's digest of that file: a cached file is used only when it still matches.
        kind: ``":all:"`` is given to pip as ``--only-binary`` for ``"wheel"``, as
            ``--no-binary`` for ``"sdist"``.

    Raises:
        SystemExit: pip failed or the file's sha256 is not PyPI's.
    """
    pinned = folder / name
    if pinned.is_file() and _sha256(pinned) == sha256:
        return pinned
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as download:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary" if kind == "wheel" else "--no-binary",
            ":all:",
            "--dest",
            download,
            f"accelerate=={ACCELERATE_VERSION}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        fetched = Path(download) / name
        if not fetched.is_file():
            raise SystemExit(
                f"peer: `{' '.join(command)}` failed (exit {done.returncode}):\n"
                f"{done.stdout}{done.stderr}"
            )
        digest = _sha256(fetched)
        if digest != sha256:
            raise SystemExit(
                f"peer: {name} has sha256 {digest}, expected {sha256} (PyPI's file); "
                "check the package index pip uses."
            )
        fetched.replace(pinned)
    return pinned


def fetch_wheel(folder: Path) -> Path:
    """The pinned Accelerate wheel (see :func:`fetch_pinned`)."""
    return fetch_pinned(folder, WHEEL_NAME, WHEEL_SHA256, "wheel")


def rename_imports(text: str) -> str:
    """``accelerate`` -> ``accel`` wherever it is a whole word (lowercase, as in imports)."""
    return re.sub(r"\baccelerate\b", "accel", text)


def extract_scripts(wheel: Path, destination: Path, *, rename: bool) -> Path:
    """Copy the wheel's ``test_utils/scripts`` tree into ``destination``; return its root."""
    root = destination / "scripts"
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if not member.startswith(SCRIPTS_PREFIX) or member.endswith("/"):
                continue
            target = root / member[len(SCRIPTS_PREFIX) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            text = archive.read(member).decode("utf-8")
            target.write_text(rename_imports(text) if rename else text)
    return root


def imported_names(source: str, package: str) -> list[str]:
    """Dotted names ``package.module[.name]`` that a script imports from ``package``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == package:
                names.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.extend(a.name for a in node.names if a.name.split(".")[0] == package)
    return names


def resolves(dotted: str) -> bool:
    """Whether ``a.b.c`` is an importable module or an attribute of one."""
    try:
        importlib.import_module(dotted)
        return True
    except ImportError:
        pass
    module, _, attribute = dotted.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), attribute)
    except ImportError:
        return False


def missing_imports(root: Path, package: str) -> dict[str, list[str]]:
    """Per script, the imported names that do not resolve in this interpreter."""
    missing: dict[str, list[str]] = {}
    for script in SCRIPTS:
        names = imported_names((root / script.path).read_text(), package)
        absent = sorted({name for name in names if not resolves(name)})
        if absent:
            missing[script.path] = absent
    return missing


def _planned(name: str) -> str | None:
    for prefix, work in IMPORTS_PLANNED.items():
        if name == prefix or name.startswith(prefix + "."):
            return work
    return None


def job_env(home: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """This environment without an enclosing job's variables, offline, CPU only, no config file."""
    env = {key: value for key, value in os.environ.items() if not _LAUNCHER_VARIABLES.match(key)}
    env.update(
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        HF_HOME=str(home),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",
    )
    env.update(extra)
    return env


def _console_script(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise SystemExit(
            f"peer: the {name} console script is not installed beside {sys.executable}"
        )
    return str(path)


def command_for(
    script: PeerScript, path: Path, processes: int, target: str
) -> tuple[list[str], dict[str, str]]:
    """The command line Accelerate's suite would use with ``target``'s launcher, and extra env."""
    if script.how == "python":
        return [sys.executable, str(path)], {}
    env: dict[str, str] = {}
    if target == "accel":
        launcher = [_console_script("accel"), "launch", "--cpu"]
    elif processes == 1:
        launcher = [_console_script("accelerate"), "launch", "--cpu"]
    else:
        # Accelerate's --cpu starts one process whatever --num_processes says (its multi-CPU
        # launch is mpirun); --multi_gpu goes through torchrun, and ACCELERATE_USE_CPU makes its
        # Accelerator pick gloo on the CPU (a PartialState made first stays one process each).
        launcher = [_console_script("accelerate"), "launch", "--multi_gpu"]
        env["ACCELERATE_USE_CPU"] = "true"
    return [*launcher, "--num_processes", str(processes), *script.flags, str(path)], env


def _tail(text: str) -> str:
    return "\n".join(text.splitlines()[-OUTPUT_TAIL_LINES:])


def run_one(
    script: PeerScript, processes: int, root: Path, work: Path, target: str
) -> tuple[Outcome, str]:
    """Run one script on ``processes`` processes; return what it did and its output."""
    reason = script.skip_reason(processes)
    if reason is not None:
        return Outcome(script, processes, SKIPPED, reason), ""
    cwd = work / f"{script.path.replace('/', '_')}-{processes}"
    cwd.mkdir(parents=True)
    command, launcher_env = command_for(script, root / script.path, processes, target)
    extra = {**script.env, **launcher_env, "ACCELERATE_NUM_PROCESSES": str(processes)}
    log = cwd / "output.log"
    start = time.monotonic()
    with log.open("w") as output:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=job_env(cwd / "hf_home", extra),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            # Whatever it left behind (forked workers included) goes with it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    seconds = time.monotonic() - start
    text = log.read_text(errors="replace")
    if code is None:
        return Outcome(script, processes, FAIL, f"timed out after {RUN_TIMEOUT_S} s", seconds), text
    if code != 0:
        return Outcome(script, processes, FAIL, f"exit code {code}", seconds), text
    return Outcome(script, processes, PASS, "", seconds), text


def expected_status(script: PeerScript, processes: int, target: str) -> str:
    """What a run should give: the recorded baseline for Accelerate, pass for accel."""
    if script.skip_reason(processes) is not None:
        return SKIPPED
    if target == "accelerate":
        return ACCELERATE_BASELINE.get((script.path, processes), PASS)
    return EXPECTED_DIFFERENCE if processes in script.differs else PASS


def _selected(only: Iterable[str] | None) -> list[PeerScript]:
    wanted = set(only or ())
    unknown = wanted - {script.path for script in SCRIPTS}
    if unknown:
        raise SystemExit(
            f"peer: --only {sorted(unknown)}: not a shipped script; choose from "
            f"{', '.join(script.path for script in SCRIPTS)}"
        )
    return [script for script in SCRIPTS if not wanted or script.path in wanted]


def import_problems(root: Path) -> list[str]:
    """Names the scripts import that accel lacks, unless planned (those are only reported)."""
    problems = []
    for path, names in missing_imports(root, "accel").items():
        for name in names:
            planned = _planned(name)
            if planned is None:
                problems.append(f"{path} imports {name}, which accel lacks")
            else:
                print(f"peer: {path} imports {name}: not in accel yet ({planned})")
    return problems


def differences_problems(scripts: Iterable[PeerScript]) -> list[str]:
    """Expected differences whose entry is missing from docs/accelerate.md's list of differences."""
    text = DIFFERENCES_PAGE.read_text()
    section = text[text.find(DIFFERS_HEADING) :].split("\n## ", 1)[0]
    return [
        f"{script.path} x{count}: the {DIFFERS_HEADING!r} list of {DIFFERENCES_PAGE.name} has "
        f"no entry {entry!r}"
        for script in scripts
        for count, (entry, _) in script.differs.items()
        if entry not in section
    ]


def run_and_judge(
    script: PeerScript, processes: int, root: Path, work: Path, target: str
) -> tuple[Outcome, str | None]:
    """Run one script x process count; return its outcome and a problem when unexpected."""
    outcome, output = run_one(script, processes, root, work, target)
    expected = expected_status(script, processes, target)
    if outcome.status == FAIL and expected == PASS and processes in script.racy:
        print(
            f"peer: {script.path} x{processes} {outcome.label}; running it once more "
            f"({script.racy[processes]})\n----- last lines of the failed run -----\n"
            f"{_tail(output)}\n-----",
            flush=True,
        )
        outcome, output = run_one(script, processes, root, work / "again", target)
        if outcome.status == PASS:
            outcome = dataclasses.replace(outcome, detail="on the second run")
    if expected == EXPECTED_DIFFERENCE and outcome.status == FAIL:
        entry, marker = script.differs[processes]
        if marker in output:
            outcome = dataclasses.replace(outcome, status=EXPECTED_DIFFERENCE, detail=entry)
    timing = f" ({outcome.seconds:.1f} s)" if outcome.status != SKIPPED else ""
    print(f"peer: {script.path} x{processes} {outcome.label}{timing}", flush=True)
    if outcome.status == expected:
        return outcome, None
    if output:
        print(f"----- last lines of {script.path} x{processes} -----\n{_tail(output)}\n-----")
    problem = f"{script.path} x{processes}: {outcome.status} {outcome.detail}".rstrip()
    return outcome, f"{problem}, expected {expected}"


def summarise(outcomes: list[Outcome], problems: list[str]) -> None:
    """The summary line (every script x process count), the unexpected outcomes, the counts."""
    print(
        "peer summary: " + "; ".join(f"{o.script.path} x{o.processes} {o.label}" for o in outcomes),
        flush=True,
    )
    for problem in problems:
        print(f"peer: UNEXPECTED: {problem}")
    counts = {
        status: sum(o.status == status for o in outcomes)
        for status in (PASS, FAIL, SKIPPED, EXPECTED_DIFFERENCE)
    }
    print(
        f"peer: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIPPED]} skipped, "
        f"{counts[EXPECTED_DIFFERENCE]} expected differences; "
        f"{sum(o.seconds for o in outcomes):.0f} s of runs"
    )


def main(argv: list[str] | None = None) -> int:
    """Fetch, rewrite, check imports, run, summarise; 0 when every outcome is the expected one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=["accel", "accelerate"], default="accel")
    parser.add_argument("--only", nargs="+", metavar="SCRIPT", help="run these scripts only")
    parser.add_argument(
        "--processes", nargs="+", type=int, default=list(PROCESS_COUNTS), choices=PROCESS_COUNTS
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    scripts = _selected(args.only)
    wheel = fetch_wheel(cache_dir())
    print(f"peer: {args.target} against the test scripts of {wheel.name}", flush=True)

    work = Path(tempfile.mkdtemp(prefix="accel_peer_"))
    problems: list[str] = []
    outcomes: list[Outcome] = []
    try:
        root = extract_scripts(wheel, work, rename=args.target == "accel")
        if args.target == "accel":
            problems += import_problems(root) + differences_problems(scripts)
        for script in scripts:
            for processes in sorted(args.processes):
                outcome, problem = run_and_judge(script, processes, root, work, args.target)
                outcomes.append(outcome)
                problems += [problem] if problem else []
    finally:
        if args.keep:
            print(f"peer: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    summarise(outcomes, problems)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
