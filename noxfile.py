"""Test, lint and benchmark sessions for every accel package against CPU/gloo, CUDA/NCCL and XLA.

Each ``tests(package, backend)`` session installs one package from its folder into a fresh venv
together with only the sibling packages its pyproject declares, so a missing dependency declaration
fails there. ``nox -t ci`` is what CI runs.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shutil
import sys
from pathlib import Path

import nox
import tomllib

ROOT = Path(__file__).resolve().parent
PACKAGES_DIR = ROOT / "packages"
PACKAGES = ["accel-state", "accel-ops", "accel-data", "accel-ckpt", "accel-launch", "accel"]
BACKENDS = ["cpu", "cuda", "xla"]
CONSTRAINTS = {backend: str(ROOT / "constraints" / f"{backend}.txt") for backend in BACKENDS}
TEST_TOOLS = ["pytest", "pytest-timeout"]
# A worker process gets one thread per core at most; with 2-3 ranks on 2 cores, 1 is right.
TEST_ENV = {"OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
# The CPU legs mean CPU on any machine: no GPU is visible to them, so a contributor's GPU
# workstation runs the same tests as CI (the cuda leg selects the tests that need a GPU).
CPU_ENV = {**TEST_ENV, "CUDA_VISIBLE_DEVICES": ""}
# DeepSpeed on the CPU legs: its CPU accelerator, and its C++ ops built once into a cache that
# outlives the venvs (the first build takes minutes; later runs load it).
CPU_ENV |= {
    "DS_ACCELERATOR": "cpu",
    "TORCH_EXTENSIONS_DIR": os.environ.get(
        "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "accel-torch-extensions")
    ),
}
# Each supported way to install, the script that proves it works, and how the script is run.
INSTALL_CHECKS_DIR = ROOT / "tests-integration" / "install"
INSTALLS = {
    "accel": (
        PACKAGES,
        ["accel", "launch", "--cpu", "--num_processes", "2", "whole_api.py", "{tmp}/checkpoint"],
    ),
    "state-ops": (["accel-state", "accel-ops"], ["python", "collectives.py"]),
    "state-ops-data": (["accel-state", "accel-ops", "accel-data"], ["python", "dataloader.py"]),
    "state-launch": (
        ["accel-state", "accel-launch"],
        ["accel-launch", "--cpu", "--num_processes", "2", "plain_torch.py"],
    ),
}

nox.options.reuse_venv = "yes"
# uv hard-links one copy of torch into every venv (seconds instead of half a minute each, and the
# multi-GB XLA leg does not multiply on disk); plain virtualenv + pip is the fallback.
nox.options.default_venv_backend = "uv|virtualenv"
if os.environ.get("PIP_FIND_LINKS") and not os.environ.get("UV_FIND_LINKS"):
    # Local wheel folders configured for pip (such as a CPU build of torch) serve uv too.
    os.environ["UV_FIND_LINKS"] = ",".join(os.environ["PIP_FIND_LINKS"].split())
nox.options.sessions = ["lint", "typecheck", "install", "tests", "integration", "peer"]


def declared_dependencies(package: str) -> list[str]:
    """The requirement names a package's pyproject declares (no versions, no extras)."""
    project = tomllib.loads((PACKAGES_DIR / package / "pyproject.toml").read_text())["project"]
    return [
        re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]
        for requirement in project["dependencies"]
    ]


def local_closure(package: str) -> list[str]:
    """The package and every sibling it needs, dependencies first."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        for dependency in declared_dependencies(name):
            if dependency in PACKAGES and dependency not in ordered:
                visit(dependency)
        if name not in ordered:
            ordered.append(name)

    visit(package)
    return ordered


def package_targets(packages: list[str], extras: str = "test") -> list[str]:
    """pip arguments installing ``packages`` from their folders, with an extra where declared."""
    targets = []
    for name in packages:
        project = tomllib.loads((PACKAGES_DIR / name / "pyproject.toml").read_text())["project"]
        wanted = extras if extras in project.get("optional-dependencies", {}) else ""
        targets.append(f"{PACKAGES_DIR / name}[{wanted}]" if wanted else str(PACKAGES_DIR / name))
    return targets


def install_packages(session: nox.Session, backend: str, packages: list[str], *extra: str) -> None:
    """Install sibling packages and tools under the backend's constraints."""
    session.install("-c", CONSTRAINTS[backend], *package_targets(packages), *TEST_TOOLS, *extra)


def install_over_system_torch(session: nox.Session, packages: list[str]) -> None:
    """Make the machine's CUDA build of torch visible in the venv, then add our packages.

    GPU machines ship torch built for their driver and may have no index to install from, so the
    venv links the site-packages of ``$ACCEL_CUDA_PYTHON`` (default ``python3``) and our packages
    go in without dependencies (``PIP_FIND_LINKS`` may point at carried wheels such as hatchling).
    """
    python = os.environ.get("ACCEL_CUDA_PYTHON", "python3")
    code = "import site, torch; print(chr(10).join(site.getsitepackages()))"
    output = session.run(python, "-c", code, external=True, silent=True)
    purelib = session.run(
        "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True
    )
    if not isinstance(output, str) or not isinstance(purelib, str):
        session.error(f"cuda leg: {python} has no torch to reuse")
    Path(purelib.strip(), "accel_system_torch.pth").write_text(output)
    session.install("--no-deps", *package_targets(packages, extras=""))


def xla_requirements(backend: str) -> list[str]:
    """torch_xla for the xla leg; on a TPU VM (``PJRT_DEVICE=TPU``) with its TPU runtime, libtpu.

    Its torch build (``constraints/xla.txt``) is ~4 GB with its CUDA libraries: the first leg
    downloads it into uv's cache, every other xla venv hard-links the same files.
    """
    if backend != "xla":
        return []
    return ["torch_xla[tpu]" if os.environ.get("PJRT_DEVICE", "").upper() == "TPU" else "torch_xla"]


def nvidia_gpu_present() -> bool:
    """Whether this machine has an NVIDIA driver and at least one GPU."""
    return shutil.which("nvidia-smi") is not None and Path("/dev/nvidia0").exists()


def remove_stale_build_locks(session: nox.Session) -> None:
    """Delete DeepSpeed build locks left in the shared extensions cache by a killed compile.

    Every DeepSpeed job would otherwise wait for such a lock forever (torch never times out on
    it). Only locks no process on this machine holds go; accel warns users about the same locks.
    """
    session.run("python", "-m", "accel.utils.build_locks", "--remove", env=CPU_ENV)


@nox.session
@nox.parametrize("backend", [nox.param(b, tags=["ci"]) for b in BACKENDS])
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str, backend: str) -> None:
    """Run one package's tests on one backend; hardware legs select only their marked tests."""
    tests_dir = PACKAGES_DIR / package / "tests"
    pytest_args = ["pytest", str(tests_dir), "-p", "no:cacheprovider", *session.posargs]
    env = dict(CPU_ENV if backend == "cpu" else TEST_ENV)
    if backend == "cuda":
        if not nvidia_gpu_present():
            session.skip(
                "cuda leg: no NVIDIA GPU on this machine (nvidia-smi or /dev/nvidia0 missing)"
            )
        pytest_args += ["-m", "cuda"]
    elif backend == "xla":
        if platform.system() != "Linux" or platform.machine() != "x86_64":
            session.skip(
                f"xla leg: torch_xla wheels exist for Linux x86_64, not {platform.platform()}"
            )
        pytest_args += ["-m", "xla"]
        env["PJRT_DEVICE"] = os.environ.get("PJRT_DEVICE", "CPU")
    if backend == "cuda":
        install_over_system_torch(session, local_closure(package))
    else:
        install_packages(session, backend, local_closure(package), *xla_requirements(backend))
    if backend == "cpu" and package == "accel":
        remove_stale_build_locks(session)
    # Exit code 5 (no tests collected) passes only on the cuda leg, whose GPU tests not every
    # package has yet; every package has xla tests, so an empty xla leg is a failure.
    session.run(*pytest_args, env=env, success_codes=[0, 5] if backend == "cuda" else [0])


@nox.session(tags=["ci"])
def integration(session: nox.Session) -> None:
    """Cross-package, multi-process and CLI end-to-end tests (the example needs scikit-learn)."""
    install_packages(session, "cpu", PACKAGES, "scikit-learn")
    remove_stale_build_locks(session)
    session.run(
        "pytest",
        str(ROOT / "tests-integration"),
        "-p",
        "no:cacheprovider",
        *session.posargs,
        env=CPU_ENV,
    )


# What Accelerate's shipped test scripts import besides accel (scripts/peer_scripts.py): pytest
# (test_notebook.py), numpy, and the Hugging Face libraries of external_deps/test_metrics.py,
# pinned so the session is the same on every machine. pip downloads the pinned Accelerate wheel.
PEER_SCRIPT_DEPENDENCIES = [
    "pip",
    "pytest",
    "numpy",
    "transformers==5.24.0",
    "datasets==5.2.0",
    "evaluate==0.4.6",
]
# What Accelerate's unit suite (scripts/peer_unit_tests.py) imports besides those: its test tools
# and the optional libraries whose tests should run rather than skip. Both venvs get the same set.
PEER_UNIT_DEPENDENCIES = [
    "pytest-timeout",
    "pytest-subtests",
    "parameterized",
    "packaging",
    "psutil",
    "torchdata",
]
PEER_ENV = {**CPU_ENV, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
PEER_BASELINE_VENV = ROOT / ".nox" / "peer-accelerate-1-15-0"

# Tests of Accelerate 1.15.0's unit suite that pass on Accelerate and fail on accel, each with its
# reason: a deliberate difference named in the README's list, or what this machine lacks. Any
# other such test fails the session, and so does an entry whose test passes on accel.
_TORCHDATA_STATE = (
    "README, deliberately differs: a prepared loader's state_dict is accel's own resume record "
    "even with use_stateful_dataloader=True; the test wants torchdata's dict, key for key"
)
PEER_UNIT_EXPECTED_FAILURES: dict[str, str] = {
    "test_cli.py::TpuConfigTester::test_base": (
        "README, deliberately differs: tpu-config --debug prints the gcloud command shell-quoted"
    ),
    "test_utils.py::UtilsTester::test_honor_type": (
        "README, deliberately differs: recursively_apply's TypeError also names where the leaf "
        "sits (data[1]); the test compares Accelerate's sentence verbatim"
    ),
    **{
        f"test_data_loader.py::StatefulDataLoaderTester::test_{kind}stateful_dataloader_adapter_"
        f"equivalent_to_torchdata_stateful_dataloader_num_workers_{workers}": _TORCHDATA_STATE
        for kind in ("", "decoupled_")
        for workers in (0, 2)
    },
}


def peer_baseline_python(session: nox.Session) -> str:
    """An interpreter with Accelerate 1.15.0 and the same test dependencies as the peer venv.

    Made with uv beside nox's own venvs and reused across runs (uv only checks what is there).
    """
    python = PEER_BASELINE_VENV / "bin" / "python"
    uv = [sys.executable, "-m", "uv"]
    if not python.exists():
        session.run(*uv, "venv", "--quiet", str(PEER_BASELINE_VENV), external=True)
    session.run(
        *uv,
        "pip",
        "install",
        "--quiet",
        "--python",
        str(python),
        "-c",
        CONSTRAINTS["cpu"],
        "torch",
        "accelerate==1.15.0",
        *PEER_SCRIPT_DEPENDENCIES,
        *PEER_UNIT_DEPENDENCIES,
        external=True,
    )
    return str(python)


@nox.session(tags=["ci"])
def peer(session: nox.Session) -> None:
    """Accelerate 1.15's own test scripts and unit suite, renamed to accel, on the CPU.

    The scripts (scripts/peer_scripts.py) run on 1 and 2 processes from the pinned wheel; the unit
    suite (scripts/peer_unit_tests.py) runs from the pinned sdist on accel and, unrenamed, on
    Accelerate itself in a second venv, compared test by test. Both downloads are kept in
    ~/.cache/accel-peer (sha256 checked) and only read. Arguments go to the scripts' runner.
    """
    session.install(
        "-c",
        CONSTRAINTS["cpu"],
        *package_targets(PACKAGES, extras="fsdp"),
        *PEER_SCRIPT_DEPENDENCIES,
        *PEER_UNIT_DEPENDENCIES,
    )
    session.run("python", str(ROOT / "scripts" / "peer_scripts.py"), *session.posargs, env=PEER_ENV)
    expectations = [
        f"--expect-fail={name}={why}" for name, why in PEER_UNIT_EXPECTED_FAILURES.items()
    ]
    session.run(
        "python",
        str(ROOT / "scripts" / "peer_unit_tests.py"),
        "--baseline-python",
        peer_baseline_python(session),
        *expectations,
        env=PEER_ENV,
    )


@nox.session
def peer_baseline(session: nox.Session) -> None:
    """The same scripts on Hugging Face Accelerate 1.15.0 itself, in a venv of its own."""
    session.install("-c", CONSTRAINTS["cpu"], "accelerate==1.15.0", *PEER_SCRIPT_DEPENDENCIES)
    session.run(
        "python",
        str(ROOT / "scripts" / "peer_scripts.py"),
        "--target",
        "accelerate",
        *session.posargs,
        env=PEER_ENV,
    )


@nox.session(tags=["ci"], reuse_venv=False)
@nox.parametrize("install", list(INSTALLS))
def install(session: nox.Session, install: str) -> None:
    """A user's install, nothing else: a fresh venv with the pinned torch and one ``pip install``.

    No test tools and no extras, so a module the packages use but do not declare (numpy, say)
    fails here. The venv is checked to hold no numpy, then the install's script runs on 2
    processes (see tests-integration/install/README.md).
    """
    packages, command = INSTALLS[install]
    session.install("-c", CONSTRAINTS["cpu"], *(str(PACKAGES_DIR / name) for name in packages))
    session.run(
        "python",
        "-c",
        "import importlib.util, sys; "
        "sys.exit('numpy is installed, so this venv cannot show that it is not needed' "
        "if importlib.util.find_spec('numpy') else 0)",
    )
    # Optional engines come only with their extras (accel[fp8], accel[bnb], accel[deepspeed]).
    session.run(
        "python",
        "-c",
        "import importlib.util, sys; "
        "extra = [m for m in ('torchao', 'bitsandbytes', 'deepspeed', 'transformer_engine') "
        "if importlib.util.find_spec(m)]; "
        "sys.exit(f'optional packages in a plain install: {extra}' if extra else 0)",
    )
    tmp = session.create_tmp()
    with session.chdir(INSTALL_CHECKS_DIR):
        session.run(*(part.format(tmp=tmp) for part in command), env=CPU_ENV)


# Accelerate is compared with, never run: installed without its dependencies, plus the two that
# importing accelerate and accelerate.utils needs beside what accel already brings.
API_COVERAGE_REQUIREMENTS = ["numpy", "packaging"]


@nox.session(tags=["ci"])
def api_coverage(session: nox.Session) -> None:
    """``scripts/api_coverage.py --check`` against Accelerate 1.15.0: no unexplained gap.

    Every module path of Accelerate is compared with its accel twin. Fails when a name is absent
    without a recorded reason, a signature differs without an entry in NOTES ("deliberately
    differs"), a re-export is not the same object as accel's documented one, or a module path's
    twin does not import (reasons: scripts/api_coverage_reasons.py).
    """
    session.install(
        "-c", CONSTRAINTS["cpu"], *package_targets(PACKAGES), *API_COVERAGE_REQUIREMENTS
    )
    session.install("--no-deps", "accelerate==1.15.0")
    session.run("python", str(ROOT / "scripts" / "api_coverage.py"), "--check", env=CPU_ENV)


@nox.session(tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff lint and format check over the whole repository; no import cycles between modules."""
    session.install("-c", CONSTRAINTS["cpu"], "ruff")
    session.run("ruff", "check", str(ROOT))
    session.run("ruff", "format", "--check", str(ROOT))
    session.run("python", str(ROOT / "scripts" / "import_cycles.py"))


@nox.session(tags=["ci"])
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every package's sources."""
    install_packages(session, "cpu", PACKAGES, "mypy")
    sources = [str(PACKAGES_DIR / name / "src") for name in PACKAGES]
    session.run("mypy", "--config-file", str(ROOT / "mypy.ini"), *sources)


@nox.session
@nox.parametrize("accelerate", [False, True])
def bench(session: nox.Session, accelerate: bool) -> None:
    """Run every benchmark in benchmarks/ and write benchmarks/RESULTS.md.

    Each benchmark measures its raw-PyTorch baseline in the same run and prints markdown tables
    of ratios; this session adds the machine, the date and the command. With
    ``accelerate=True`` Hugging Face Accelerate is installed too and benchmarks that support it
    show its figures beside ours.
    """
    install_packages(session, "cpu", PACKAGES, *(["accelerate"] if accelerate else []))
    scripts = sorted((ROOT / "benchmarks").glob("bench_*.py"))
    sections = []
    for script in scripts:
        output = session.run("python", str(script), *session.posargs, env=TEST_ENV, silent=True)
        session.log(str(output))
        sections.append(
            f"## `{script.name}`\n\nCommand: `python benchmarks/{script.name}`\n\n{output}"
        )
    versions = session.run(
        "python",
        "-c",
        "import torch, platform; print(torch.__version__, platform.python_version())",
        silent=True,
    )
    torch_version, python_version = str(versions).split()
    header = (
        "# Benchmark results\n\n"
        f"Written by `nox -s bench` on {datetime.date.today().isoformat()}; machine: "
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; torch {torch_version}, "
        f"Python {python_version}. Every ratio is accel / its raw-PyTorch baseline measured in the "
        "same run (alternating, medians).\n"
    )
    (ROOT / "benchmarks" / "RESULTS.md").write_text(header + "\n" + "\n".join(sections))


@nox.session
def demo(session: nox.Session) -> None:
    """Train the digits example on 2 CPU processes through accel launch (about a minute)."""
    install_packages(session, "cpu", PACKAGES, "scikit-learn")
    remove_stale_build_locks(session)
    session.run(
        "accel",
        "launch",
        "--cpu",
        "--num_processes",
        "2",
        str(ROOT / "examples" / "train_digits.py"),
        "--project_dir",
        str(ROOT / ".nox" / "demo-runs" / "digits"),
        *session.posargs,
        env={"OMP_NUM_THREADS": "1"},
    )
