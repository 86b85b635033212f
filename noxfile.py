"""Test, lint and benchmark sessions for every accel package against CPU/gloo, CUDA/NCCL and XLA.

Each ``tests(package, backend)`` session installs one package from its folder into a fresh venv
together with only the sibling packages its pyproject declares, so a missing dependency declaration
fails there. ``nox -t ci --parallel 2`` is what CI runs; its last session, ``ci_times``, prints
how long each session took (and its pytest counts) and writes the same to ``.nox/ci-times.json``.

Under ``--parallel 2`` every session but ``ci_times`` may run beside another, and nox starts
them in the order they are defined here, so the order is the schedule: ``deepspeed_ops`` first
(the DeepSpeed builds the later sessions install), ``multihost`` (mostly waiting on timeouts)
beside accel's CPU tests, the other package legs, then sessions that mostly wait (``slurm``,
``ft``, ``ray``) defined between the CPU-bound ones (``integration``, ``ecosystem``, the
``torch_versions`` legs, ``peer``), so that one's waiting overlaps the other's computing.
Three at a time was measured (2026-11-29) and gained nothing: the cores were already busy 1.76
of 2 on average, and a third session's ranks only competed for them. The quick checks come
last, and ``ci_times``, alone at the end, reports.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import importlib.util
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import nox
import tomllib
from nox.sessions import _SessionSkip as SessionSkipped  # what session.skip() raises

# When this nox run started (seconds since the epoch). Under --parallel each session runs in a nox
# process of its own, started by this one: they inherit the variable, so every record of the run
# and ci_times's wall time count from the same start.
RUN_STARTED_VARIABLE = "ACCEL_CI_RUN_STARTED"
os.environ.setdefault(RUN_STARTED_VARIABLE, repr(time.time()))
RUN_STARTED = float(os.environ[RUN_STARTED_VARIABLE])

ROOT = Path(__file__).resolve().parent
PACKAGES_DIR = ROOT / "packages"
PACKAGES = ["accel-state", "accel-ops", "accel-data", "accel-ckpt", "accel-launch", "accel"]
BACKENDS = ["cpu", "cuda", "xla"]
CONSTRAINTS = {backend: str(ROOT / "constraints" / f"{backend}.txt") for backend in BACKENDS}
TEST_TOOLS = ["pytest", "pytest-timeout"]
# A worker process gets one thread per core at most; with 2-3 ranks on 2 cores, 1 is right.
# Bytecode caching on, as in a user's Python, even where the machine turns it off
# (PYTHONDONTWRITEBYTECODE=1): otherwise every test process compiles torch and every library it
# imports from source again, about a second of CPU per process for torch alone.
TEST_ENV = {"OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", "PYTHONDONTWRITEBYTECODE": ""}
# The CPU legs mean CPU on any machine: no GPU is visible to them, so a contributor's GPU
# workstation runs the same tests as CI (the cuda leg selects the tests that need a GPU).
# DeepSpeed there uses its CPU accelerator, with its C++ ops compiled in ahead of time (see
# deepspeed_wheel). Sessions pass cpu_env(session), which adds the session's own, emptied
# TORCH_EXTENSIONS_DIR: a test that compiles an op at run time leaves it there, and the session
# fails naming it (see timed).
CPU_ENV = {**TEST_ENV, "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"}
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
nox.options.sessions = [
    "lint",
    "typecheck",
    "install",
    "tests",
    "integration",
    "peer",
    "ecosystem",
    "slurm",
    "ray",
    "torch_versions",
    "ci_times",
]


def load_script_module(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` (registered in ``sys.modules``: dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import scripts/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# What each session of this nox run took: the timed decorator saves a record file per session
# (sessions under --parallel run in nox processes of their own), the last session (ci_times)
# reads those of this run and reports.
session_times = load_script_module("session_times")
SESSION_RECORDS = ROOT / ".nox" / "ci-times"
JUNIT_DIR = ROOT / ".nox" / "ci-junit"
CI_TIMES_JSON = ROOT / ".nox" / "ci-times.json"


def junit_path(session: nox.Session) -> Path:
    """Where this session's pytest run writes its junit XML, for the counts in ci_times."""
    return JUNIT_DIR / session_times.junit_file_name(session.name)


def junit_args(session: nox.Session) -> list[str]:
    """pytest arguments writing the session's junit XML (read by the timed decorator)."""
    JUNIT_DIR.mkdir(parents=True, exist_ok=True)
    return [f"--junitxml={junit_path(session)}"]


def children_cpu_seconds() -> float:
    """User + system CPU time of this process's finished, waited-for children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(session_function: Callable[..., None]) -> Callable[..., None]:
    """Record the session's wall time, outcome and pytest counts for ci_times.

    Goes under ``@nox.session``/``@nox.parametrize``. The outcome is read from what the session
    raises (session.skip() -> skipped, anything else -> failed), which is re-raised for nox. The
    session's ``TORCH_EXTENSIONS_DIR`` starts empty, and a C++ op compiled into it by the
    session's tests fails the session (:func:`fail_on_compiled_extensions`).
    """

    @functools.wraps(session_function)
    def run_timed(session: nox.Session, **params: Any) -> None:
        started = time.time()
        cpu_before = children_cpu_seconds()
        junit = junit_path(session)
        junit.unlink(missing_ok=True)  # counts only from this run's pytest
        extensions = torch_extensions_dir(session)
        if extensions is not None:
            shutil.rmtree(extensions, ignore_errors=True)  # what this run compiles, if anything
        result = session_times.FAILED
        try:
            session_function(session, **params)
            fail_on_compiled_extensions(session)
            result = session_times.SUCCESS
        except SessionSkipped:
            result = session_times.SKIPPED
            raise
        finally:
            earlier = session_times.load_records(SESSION_RECORDS, RUN_STARTED)
            entry = session_times.SessionTime(
                name=session.name,
                result=result,
                seconds=time.time() - started,
                setup_seconds=session_times.setup_gap(earlier, started, RUN_STARTED),
                tests=session_times.read_junit_counts(junit),
                started=started,
                cpu_seconds=children_cpu_seconds() - cpu_before,
            )
            session_times.save_record(SESSION_RECORDS, entry)

    return run_timed


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


deepspeed_builds = load_script_module("deepspeed_builds")


def deepspeed_wheel(
    session: nox.Session,
    constraints: str = CONSTRAINTS["cpu"],
    ops: tuple[str, ...] = deepspeed_builds.ALL_OPS,
) -> list[str]:
    """Install arguments that take DeepSpeed from a wheel with ``ops`` compiled in.

    The wheel is built once per DeepSpeed, torch (both as ``constraints`` pins them) and Python,
    in a venv of its own, and kept in ``scripts/deepspeed_builds.py``'s cache, so no venv and no
    test compiles these ops again. Under ``nox --parallel`` a second session waits for the first
    one's build (a file lock). The ``deepspeed_ops`` sessions build them first in CI.
    """
    torch_version = deepspeed_builds.pinned(Path(constraints), "torch")
    version = deepspeed_builds.pinned(Path(CONSTRAINTS["cpu"]), "deepspeed")
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    folder = deepspeed_builds.wheel_folder(version, torch_version, python_tag, ops)
    with deepspeed_builds.build_lock(folder):
        wheel = deepspeed_builds.built_wheel(folder)
        if wheel is None:
            started = time.time()
            wheel = build_deepspeed_wheel(session, constraints, version, folder, ops)
            session.log(
                f"deepspeed ops: built {wheel.name} with {', '.join(ops)} compiled in, for torch "
                f"{torch_version}, in {time.time() - started:.0f} s ({folder})"
            )
        else:
            session.log(
                f"deepspeed ops: {wheel.name} for torch {torch_version} is built ({folder})"
            )
    reinstall = ["--reinstall-package", "deepspeed"] if session.venv_backend == "uv" else []
    return ["--find-links", str(folder), *reinstall]


def build_deepspeed_wheel(
    session: nox.Session, constraints: str, version: str, folder: Path, ops: tuple[str, ...]
) -> Path:
    """Build DeepSpeed ``version``'s wheel with ``ops`` compiled in, into ``folder``.

    setup.py compiles against the torch it imports, so the build runs without isolation in a
    venv holding the pinned torch and DeepSpeed's own requirements (beside nox's venvs).
    """
    torch_version = deepspeed_builds.pinned(Path(constraints), "torch")
    python = side_venv_python(
        session,
        ROOT / ".nox" / f"deepspeed-ops-build-torch-{torch_version}",
        ["torch", f"deepspeed=={version}", "setuptools", "wheel", "pip"],
        constraints,
    )
    staging = folder.with_name(folder.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    session.run_install(
        python,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-binary",
        "deepspeed",
        "--no-cache-dir",  # pip's wheel cache would hand back a build for another torch
        "--quiet",
        "--wheel-dir",
        str(staging),
        f"deepspeed=={version}",
        env=deepspeed_builds.build_env(ops, jobs=os.cpu_count() or 1),
        external=True,
    )
    built = deepspeed_builds.built_wheel(staging)
    if built is None:
        session.error(f"deepspeed ops: pip wheel wrote no DeepSpeed wheel into {staging}")
    try:
        deepspeed_builds.check_wheel(built, ops, torch_version)
    except ValueError as error:
        session.error(f"deepspeed ops: {error}")
    shutil.rmtree(folder, ignore_errors=True)
    staging.replace(folder)
    return folder / built.name


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


def torch_extensions_dir(session: nox.Session) -> Path | None:
    """Where torch would compile C++ extensions for this session (None without a venv).

    Inside the session's venv, emptied by ``timed`` when the session starts.
    """
    venv = getattr(session.virtualenv, "location", None)
    return Path(venv) / "tmp" / "torch-extensions" if venv else None


def cpu_env(session: nox.Session) -> dict[str, str]:
    """``CPU_ENV`` plus the session's own ``TORCH_EXTENSIONS_DIR``."""
    extensions = torch_extensions_dir(session)
    return {**CPU_ENV, **({"TORCH_EXTENSIONS_DIR": str(extensions)} if extensions else {})}


def fail_on_compiled_extensions(session: nox.Session) -> None:
    """Fail the session when its tests compiled a C++ op at run time (see ``deepspeed_wheel``)."""
    extensions = torch_extensions_dir(session)
    compiled = deepspeed_builds.built_extensions(extensions) if extensions else []
    if compiled:
        session.error(
            f"tests compiled {', '.join(compiled)} at run time (in {extensions}): install DeepSpeed "
            "through deepspeed_wheel() with those ops in its list, or use torch optimizers"
        )


@nox.session(python=False, allow_parallel=True)
@nox.parametrize(
    "release", [nox.param(name, tags=["ci"]) for name in ["pinned", "newest", "middle", "oldest"]]
)
@timed
def deepspeed_ops(session: nox.Session, release: str) -> None:
    """Build DeepSpeed's CPU ops into a wheel once, for the torch the sessions install.

    ``pinned`` is ``constraints/cpu.txt``'s torch (every ops DeepSpeed's tests use); ``newest``,
    ``middle`` and ``oldest`` are the torch_versions legs' releases (the ops their subset loads). Defined
    first, so CI builds them before the sessions that install DeepSpeed; each of those builds
    its wheel itself when run alone (see ``deepspeed_wheel``).
    """
    if release == "pinned":
        deepspeed_wheel(session)
    else:
        constraints = torch_release_constraints(session, release)
        deepspeed_wheel(session, constraints, TORCH_LEG_DEEPSPEED_OPS)


MULTIHOST_TESTS = ROOT / "tests-integration" / "multihost"
RAY_TESTS = MULTIHOST_TESTS / "test_ray_two_hosts.py"  # run by the ray session


@nox.session(tags=["ci"], allow_parallel=True)
@timed
def multihost(session: nox.Session) -> None:
    """Jobs over 2-3 test hosts (network namespaces with their own hostnames; needs root).

    Every host and bridge is made and deleted by the tests (``scripts/test_hosts.py``); where
    namespaces cannot be made, the tests skip with the reason.
    """
    if platform.system() != "Linux":
        session.skip(
            f"multihost: test hosts need Linux network namespaces, not {platform.platform()}"
        )
    # torchft (accel[ft]) for the replica groups on two hosts (test_replica_groups_two_hosts.py).
    install_packages(session, "cpu", PACKAGES, f"{PACKAGES_DIR / 'accel'}[ft]")
    session.run(
        "pytest",
        str(MULTIHOST_TESTS),
        f"--ignore={RAY_TESTS}",  # `nox -s ray` runs it, with Ray installed
        "-p",
        "no:cacheprovider",
        "-rs",
        *junit_args(session),
        *session.posargs,
        env=cpu_env(session),
    )


# Every package on every backend, the longest first: under --parallel, sessions start in the order
# they are listed (see the module docstring), so accel's CPU tests start early.
TEST_LEGS = [
    (package, backend)
    for backend in BACKENDS
    for package in sorted(PACKAGES, key=lambda name: (name != "accel", name != "accel-launch"))
]


@nox.session(allow_parallel=True)
@nox.parametrize(
    ("package", "backend"),
    [nox.param(package, backend, tags=["ci"]) for package, backend in TEST_LEGS],
)
@timed
def tests(session: nox.Session, package: str, backend: str) -> None:
    """Run one package's tests on one backend; hardware legs select only their marked tests."""
    tests_dir = PACKAGES_DIR / package / "tests"
    pytest_args = [
        "pytest",
        str(tests_dir),
        "-p",
        "no:cacheprovider",
        *junit_args(session),
        *session.posargs,
    ]
    env = cpu_env(session) if backend == "cpu" else dict(TEST_ENV)
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
        # accel's tests run DeepSpeed (accel[test]) on the CPU: from the wheel with its ops built.
        prebuilt = deepspeed_wheel(session) if (backend, package) == ("cpu", "accel") else []
        install_packages(
            session, backend, local_closure(package), *xla_requirements(backend), *prebuilt
        )
    # Exit code 5 (no tests collected) passes only on the cuda leg, whose GPU tests not every
    # package has yet; every package has xla tests, so an empty xla leg is a failure.
    session.run(*pytest_args, env=env, success_codes=[0, 5] if backend == "cuda" else [0])


# ----------------------------------------------------------------------------- clusters
# Where people scale past one machine: real SLURM clusters (scripts/slurm_cluster.py, Debian's
# packages installed with apt-get when absent; one node on localhost, two on test hosts) and a
# two-node Ray cluster on test hosts. Their tests skip, saying why, outside these sessions.
CLUSTER_TESTS = ROOT / "tests-integration" / "clusters"
slurm_cluster = load_script_module("slurm_cluster")


def slurm_jobs_report(session: nox.Session, env: dict[str, str]) -> None:
    """Log how many jobs the cluster ran and how many times they were requeued."""
    shown = subprocess.run(
        ["scontrol", "show", "jobs", "--oneliner"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    jobs = [line for line in shown.splitlines() if line.startswith("JobId=")]
    requeues = sum(int(m) for m in re.findall(r"\bRestarts=(\d+)", shown))
    session.log(f"slurm: {len(jobs)} jobs ran on the cluster, requeued {requeues} time(s) in all")


@nox.session(tags=["ci"], allow_parallel=True)
@timed
def slurm(session: nox.Session) -> None:
    """Real sbatch/srun jobs on a one-node SLURM cluster, and on two nodes (test hosts).

    One node (started here, 2 CPUs): ``srun python`` trains, is preempted with ``scancel
    --signal=TERM`` and the requeued job resumes to bit-equal weights. Two nodes
    (``test_slurm_two_nodes.py`` makes two test hosts and a slurmd in each): Accelerate's
    ``sbatch -N2`` + ``accel launch`` shape, ``srun -N2 python``, preemption, a lost node; replica
    groups, one per node (``test_slurm_replica_groups.py``, torchft). The daemons are stopped by
    PID at the end whatever happens (and at exit, should nox itself be interrupted).
    """
    if platform.system() != "Linux":
        session.skip(f"slurm: the daemons run on Linux, not {platform.platform()}")
    if slurm_cluster.missing_commands():
        try:
            slurm_cluster.install_with_apt()
        except slurm_cluster.ClusterError as error:
            session.skip(f"slurm: {error}")
    # torchft (accel[ft]) for the replica groups, one per node (test_slurm_replica_groups.py).
    install_packages(session, "cpu", PACKAGES, f"{PACKAGES_DIR / 'accel'}[ft]")
    root = Path(tempfile.mkdtemp(prefix="accel-slurm-"))
    cluster = slurm_cluster.start(root)
    atexit.register(slurm_cluster.stop, cluster)
    try:
        session.run(
            "pytest",
            str(CLUSTER_TESTS / "test_slurm.py"),
            str(CLUSTER_TESTS / "test_slurm_two_nodes.py"),
            str(CLUSTER_TESTS / "test_slurm_replica_groups.py"),
            "-p",
            "no:cacheprovider",
            "-rs",
            *junit_args(session),
            *session.posargs,
            env={**cpu_env(session), **cluster.env},
        )
    finally:
        slurm_jobs_report(session, cluster.env)
        slurm_cluster.stop(cluster)
        shutil.rmtree(root, ignore_errors=True)


@nox.session(tags=["ci"], allow_parallel=True)
@timed
def integration(session: nox.Session) -> None:
    """Cross-package, multi-process and CLI end-to-end tests (the example needs scikit-learn)."""
    install_packages(session, "cpu", PACKAGES, "scikit-learn", *deepspeed_wheel(session))
    session.run(
        "pytest",
        str(ROOT / "tests-integration"),
        # Sessions of their own run these: ecosystem (transformers, PEFT, TRL installed), slurm
        # and ray (a real cluster), multihost (test hosts in network namespaces, as root), ft
        # (torchft installed).
        "--ignore",
        str(ROOT / "tests-integration" / "ecosystem"),
        "--ignore",
        str(ROOT / "tests-integration" / "ft"),
        "--ignore",
        str(ROOT / "tests-integration" / "clusters"),
        "--ignore",
        str(ROOT / "tests-integration" / "multihost"),
        "-p",
        "no:cacheprovider",
        *junit_args(session),
        *session.posargs,
        env=cpu_env(session),
    )


FT_TESTS = ROOT / "tests-integration" / "ft"


@nox.session(tags=["ci"], allow_parallel=True)
@timed
def ft(session: nox.Session) -> None:
    """Per-step fault tolerance across replica groups (torchft) through ``accel launch``.

    Replica groups on loopback train the everyday loop while single groups are SIGKILLed in
    each phase of a step (forward, backward, the all-reduce across groups, between commit and
    optimizer step, inside it, in ``save_state``, while healing); the survivors go on, the
    killed group heals from them, and the replicas end bit-equal with every sample used in
    exactly one committed step. DDP and FSDP2 groups, 3 groups, too few groups, a lost
    lighthouse. Installed as a user does: ``accel[ft,fsdp]``. The jobs mostly wait on
    heartbeats and timeouts, so the session runs beside the others under ``--parallel``.
    """
    session.install(
        "-c",
        CONSTRAINTS["cpu"],
        *package_targets(PACKAGES),
        f"{PACKAGES_DIR / 'accel'}[ft,fsdp]",
        *TEST_TOOLS,
    )
    session.run(
        "pytest",
        str(FT_TESTS),
        "-p",
        "no:cacheprovider",
        "-rs",
        *junit_args(session),
        *session.posargs,
        env=cpu_env(session),
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
# Tests of the unit suite that pass on Accelerate and fail on accel only on an older torch, by
# release, each with its reason (the same rules as PEER_UNIT_EXPECTED_FAILURES).
PEER_UNIT_EXPECTED_FAILURES_BY_RELEASE: dict[str, dict[str, str]] = {
    "oldest": {
        f"test_dataclasses.py::TestParallelismConfig::test_build_device_mesh[{case}]": (
            "docs/reference/torch-versions.md: accel refuses device meshes below torch 2.6 "
            "(2.9 on the CPU) before building one (gate device_mesh); the test replaces torch's "
            "init_device_mesh with a stand-in, which Accelerate builds on any torch"
        )
        for case in (
            "8-1-1-1-expected_shape0-expected_dim_names0",
            "1-8-1-1-expected_shape1-expected_dim_names1",
            "2-4-1-1-expected_shape2-expected_dim_names2",
            "1-4-2-1-expected_shape3-expected_dim_names3",
            "2-2-2-1-expected_shape4-expected_dim_names4",
            "1-1-8-1-expected_shape5-expected_dim_names5",
        )
    },
}
# Added to cpu_env(session) for the peer sessions: the Hugging Face libraries stay offline.
PEER_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
PEER_BASELINE_VENV = ROOT / ".nox" / "peer-accelerate-1-15-0"
# Accelerate's own outcomes of its unit suite, per release: recorded by peer_reference, read by
# peer (scripts/peer_unit_tests.py --record / --baseline-outcomes).
PEER_REFERENCE_DIR = ROOT / "scripts" / "peer_reference"
PEER_RELEASES = ("pinned", "oldest")

# Tests of Accelerate 1.15.0's unit suite that pass on Accelerate and fail on accel, each with its
# reason: a deliberate difference listed in docs/accelerate.md, or what this machine lacks. Any
# other such test fails the session, and so does an entry whose test passes on accel.
_TORCHDATA_STATE = (
    "docs/accelerate.md, deliberately differs: a prepared loader's state_dict is accel's own "
    "resume record even with use_stateful_dataloader=True; the test wants torchdata's dict, key "
    "for key"
)
PEER_UNIT_EXPECTED_FAILURES: dict[str, str] = {
    "test_cli.py::TpuConfigTester::test_base": (
        "docs/accelerate.md, deliberately differs: tpu-config --debug prints the gcloud command "
        "shell-quoted"
    ),
    "test_utils.py::UtilsTester::test_honor_type": (
        "docs/accelerate.md, deliberately differs: recursively_apply's TypeError also names "
        "where the leaf sits (data[1]); the test compares Accelerate's sentence verbatim"
    ),
    **{
        f"test_data_loader.py::StatefulDataLoaderTester::test_{kind}stateful_dataloader_adapter_"
        f"equivalent_to_torchdata_stateful_dataloader_num_workers_{workers}": _TORCHDATA_STATE
        for kind in ("", "decoupled_")
        for workers in (0, 2)
    },
}


def side_venv_python(
    session: nox.Session,
    venv: Path,
    requirements: list[str],
    constraints: str = CONSTRAINTS["cpu"],
) -> str:
    """An interpreter in ``venv`` holding ``requirements`` under ``constraints``.

    For a second venv a session needs beside its own (a real Accelerate to compare with, a
    DeepSpeed build): made with uv beside nox's own venvs and reused across runs (uv only checks
    what is there).
    """
    python = venv / "bin" / "python"
    uv = [sys.executable, "-m", "uv"]
    if not python.exists():
        session.run_install(*uv, "venv", "--quiet", str(venv), external=True)
    session.run_install(
        *uv,
        "pip",
        "install",
        "--quiet",
        "--python",
        str(python),
        "-c",
        constraints,
        *requirements,
        external=True,
    )
    return str(python)


def peer_baseline_python(
    session: nox.Session, constraints: str = CONSTRAINTS["cpu"], release: str = "pinned"
) -> str:
    """Accelerate 1.15.0 with the same test dependencies (and torch) as the peer venv."""
    requirements = [
        "torch",
        "accelerate==1.15.0",
        *PEER_SCRIPT_DEPENDENCIES,
        *PEER_UNIT_DEPENDENCIES,
    ]
    venv = PEER_BASELINE_VENV if release == "pinned" else Path(f"{PEER_BASELINE_VENV}-{release}")
    return side_venv_python(session, venv, requirements, constraints)


# The Hugging Face libraries whose users run on accel through `accel launch --as-accelerate`,
# pinned: the ecosystem session runs their trainers on accel and, for comparison, on Accelerate.
ECOSYSTEM_LIBRARIES = [
    "transformers==5.23.0",
    "peft==0.21.2",
    "trl==1.16.0",
    "datasets==5.2.0",
    # Pinned because Accelerate's results are replayed from a record made with these releases
    # (tests-integration/ecosystem/reference): PEFT and TRL pull Accelerate in, transformers
    # pulls tokenizers, and a newer release would make the ecosystem session refuse the record.
    "accelerate==1.15.0",
    "tokenizers==0.23.3",
    "numpy",
    "deepspeed",
    # Trainer.hyperparameter_search's backend (tests-integration/ecosystem/names_job.py).
    "optuna",
    # from_pretrained(quantization_config=BitsAndBytesConfig(...)) (big_model_job.py); the
    # release constraints/cpu.txt pins, in Accelerate's venv too.
    "bitsandbytes==0.50.2",
]
ECOSYSTEM_BASELINE_VENV = ROOT / ".nox" / "ecosystem-accelerate-1-15-0"
ECOSYSTEM_TESTS = ROOT / "tests-integration" / "ecosystem"
# Accelerate's side of the ecosystem jobs, recorded (tests-integration/ecosystem/reference.py).
ECOSYSTEM_REFERENCE = ECOSYSTEM_TESTS / "reference.py"
ECOSYSTEM_BASELINE_ENV = "ACCEL_ECOSYSTEM_BASELINE_PYTHON"


def ecosystem_install(session: nox.Session) -> list[str]:
    """accel, the pinned libraries and the DeepSpeed ops wheel; the install arguments of it."""
    prebuilt = deepspeed_wheel(session)
    install_packages(session, "cpu", PACKAGES, *ECOSYSTEM_LIBRARIES, *prebuilt)
    return prebuilt


def ecosystem_baseline_python(session: nox.Session, prebuilt: list[str]) -> str:
    """Accelerate 1.15.0 beside the same pinned libraries, in a venv of its own."""
    return side_venv_python(
        session,
        ECOSYSTEM_BASELINE_VENV,
        ["torch", "accelerate==1.15.0", *ECOSYSTEM_LIBRARIES, *prebuilt],
    )


def ecosystem_pytest(session: nox.Session, env: dict[str, str], *args: str) -> None:
    """The ecosystem tests, with ``env`` added to the CPU environment."""
    session.run(
        "pytest",
        str(ECOSYSTEM_TESTS),
        "-p",
        "no:cacheprovider",
        *args,
        env={**cpu_env(session), **PEER_OFFLINE_ENV, **env},
    )


@nox.session(tags=["ci"], allow_parallel=True)
@timed
def ecosystem(session: nox.Session) -> None:
    """transformers' Trainer, TRL and PEFT on accel, against Accelerate 1.15.0's recorded results.

    The same job scripts (tests-integration/ecosystem) ran on Accelerate when the record in
    ``tests-integration/ecosystem/reference/`` was made (``ecosystem_reference``); accel's logged
    losses, grad norms and eval metrics must agree with it. The session fails, naming
    ``ecosystem_reference``, when the record was made with other library versions than it
    installs; on a machine whose CPU kernels differ from the record's it runs Accelerate's side
    live in a second venv, as before. PEFT and TRL pull the real Accelerate into accel's venv too,
    so the alias is tested where it has to win over it.
    """
    prebuilt = ecosystem_install(session)
    verdict = session.run("python", str(ECOSYSTEM_REFERENCE), "check", silent=True)
    env: dict[str, str] = {}
    if not isinstance(verdict, str) or verdict.strip().splitlines()[-1] != "replay":
        session.log(f"{verdict}: running Accelerate's side in a second venv")
        env[ECOSYSTEM_BASELINE_ENV] = ecosystem_baseline_python(session, prebuilt)
    ecosystem_pytest(session, env, *junit_args(session), *session.posargs)


@nox.session
@timed
def ecosystem_reference(session: nox.Session) -> None:
    """Record Accelerate 1.15.0's results of the ecosystem jobs (not in CI).

    Runs the ecosystem tests with Accelerate's side live in a second venv, writes its results,
    then runs every one of its jobs again and fails unless both records are identical (the
    replay relies on that). Shows how the new record differs from the committed one, then
    replaces it: commit tests-integration/ecosystem/reference/ afterwards. Run it after changing
    the pinned libraries (the ``ecosystem`` session says when).
    """
    prebuilt = ecosystem_install(session)
    baseline = ecosystem_baseline_python(session, prebuilt)
    folder = Path(session.create_tmp())
    first, second = folder / "reference-first.json", folder / "reference-second.json"
    env = {ECOSYSTEM_BASELINE_ENV: baseline, "ACCEL_ECOSYSTEM_RECORD": str(first)}
    ecosystem_pytest(session, env, *session.posargs)
    run_env = {**cpu_env(session), **PEER_OFFLINE_ENV}
    script = str(ECOSYSTEM_REFERENCE)
    session.run("python", script, "repeat", str(first), str(second), baseline, env=run_env)
    session.run("python", script, "diff", str(first), str(second))
    committed = ECOSYSTEM_TESTS / "reference" / "accelerate-1.15.0.json"
    if committed.exists():
        session.run("python", script, "diff", str(committed), str(first), success_codes=[0, 1])
    committed.parent.mkdir(exist_ok=True)
    shutil.copyfile(first, committed)
    session.log(f"ecosystem reference: wrote {committed}; commit it")


RAY_REQUIREMENT = "ray[train]==2.60.0"


@nox.session(tags=["ci"], allow_parallel=True)
@timed
def ray(session: nox.Session) -> None:
    """A two-node Ray cluster on two test hosts runs the everyday loop like accel launch does.

    ``ray start --head`` in one host, ``ray start --address`` in the other, Ray Train's
    ``TorchTrainer`` with one worker per host; ``accel launch`` over the same hosts gives the same
    weights and resumes from Ray's checkpoint. Needs root (network namespaces); the test skips
    with the reason elsewhere.
    """
    if platform.system() != "Linux":
        session.skip(f"ray: test hosts need Linux network namespaces, not {platform.platform()}")
    install_packages(session, "cpu", PACKAGES, RAY_REQUIREMENT)
    session.run(
        "pytest",
        str(RAY_TESTS),
        "-p",
        "no:cacheprovider",
        "-rs",
        *junit_args(session),
        *session.posargs,
        env=cpu_env(session),
    )


# The torch releases torch_versions tests, each pinned in its constraints file: the newest on
# PyPI (bump it when a new one ships) and the oldest the packages declare (every pyproject's
# `torch>=`, checked by the session). Their PyPI Linux wheels are multi-GB CUDA builds: uv keeps
# them in its cache and hard-links them into the venvs, as for the xla legs; GPUs stay hidden.
TORCH_RELEASES = {
    "newest": "torch-newest.txt",
    "middle": "torch-middle.txt",
    "oldest": "torch-oldest.txt",
}
# torchft 0.2.0 (accel-launch[test] -> accel-state[ft]) needs torch 2.7, as the replica_groups
# gate of accel_state.torch_compat says: legs on an older torch install accel-launch without it.
TORCHFT_MIN_TORCH = (2, 7)
TORCH_SUBSET = ROOT / "constraints" / "torch-versions-subset.txt"
# The DeepSpeed ops the subset's ZeRO runs load (they use torch's optimizers): built into the
# DeepSpeed wheel of each release by the deepspeed_ops sessions.
TORCH_LEG_DEEPSPEED_OPS = ("deepspeed_shm_comm",)


def pinned_torch(release: str) -> str:
    """The torch version ``constraints/torch-<release>.txt`` pins (its ``torch==`` line)."""
    path = ROOT / "constraints" / TORCH_RELEASES[release]
    for line in path.read_text().splitlines():
        if line.startswith("torch=="):
            return line.removeprefix("torch==").strip()
    raise ValueError(f"{path} pins no torch (add a line torch==<version>)")


def torch_release_constraints(session: nox.Session, release: str) -> str:
    """cpu.txt with the release file's pins in place of cpu.txt's, written into the session tmp."""
    overrides = (ROOT / "constraints" / TORCH_RELEASES[release]).read_text().splitlines()

    def name(line: str) -> str:
        return re.split(r"[<>=!~;\[ ]", line.strip(), maxsplit=1)[0].lower()

    pinned = {name(line) for line in overrides if line.strip() and not line.startswith("#")}
    cpu = Path(CONSTRAINTS["cpu"]).read_text().splitlines()
    lines = [line for line in cpu if line.startswith("#") or name(line) not in pinned]
    path = Path(session.create_tmp()) / f"constraints-torch-{release}.txt"
    path.write_text("\n".join([*lines, *overrides]) + "\n")
    return str(path)


def declared_torch_bounds() -> dict[str, str]:
    """Each package's lower bound on torch, from the ``torch>=X`` of its pyproject."""
    bounds = {}
    for package in PACKAGES:
        project = tomllib.loads((PACKAGES_DIR / package / "pyproject.toml").read_text())
        for requirement in project["project"]["dependencies"]:
            if match := re.fullmatch(r"torch\s*>=\s*([0-9.]+)", requirement.strip()):
                bounds[package] = match.group(1)
    return bounds


def torch_subset_groups() -> dict[Path, list[str]]:
    """The subset's node ids (``TORCH_SUBSET``) by the test folder whose pytest config runs them."""
    groups: dict[Path, list[str]] = {}
    for line in TORCH_SUBSET.read_text().splitlines():
        if not (entry := line.split("#", 1)[0].strip()):
            continue
        parts = Path(entry.split("::", 1)[0]).parts
        folder = ROOT.joinpath(
            *parts[: parts.index("tests") + 1] if "tests" in parts else parts[:1]
        )
        groups.setdefault(folder, []).append(str(ROOT / entry))
    return groups


def release_numbers(version: str) -> tuple[int, ...]:
    """``(2, 4, 1)`` for ``"2.4.1+cpu"``."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def venv_torch(session: nox.Session) -> str | None:
    """The torch version (no local part) the session's venv holds; ``None`` under --install-only."""
    found = session.run(
        "python", "-c", "import torch; print(torch.__version__)", silent=True, env=cpu_env(session)
    )
    return None if found is None else str(found).strip().splitlines()[-1].split("+")[0]


def pip_install_keeps_torch(session: nox.Session, release: str, version: str) -> None:
    """A user's ``pip install`` of the six packages into a venv that already holds ``version``.

    torch goes in first, alone; then plain pip (no constraints, no extras) installs the six
    package folders, as the install page says. The torch in the venv must be the same after:
    every package declares ``torch>=2.4``, so pip has no reason to upgrade or downgrade it.
    """
    session.install(f"torch=={version}", "pip")
    session.run(
        "python",
        "-m",
        "pip",
        "install",
        "--quiet",
        *(str(PACKAGES_DIR / name) for name in PACKAGES),
        env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    after = venv_torch(session)
    if after is not None and after != version:
        session.error(
            f"torch_versions({release}): pip install of the six packages changed torch "
            f"{version} into {after}"
        )
    if after is not None:
        session.log(f"torch {version}: pip install of the six packages kept torch {after}")


def merge_junit(parts: list[Path], target: Path) -> None:
    """Write the ``<testsuite>`` elements of several junit XML files into one file."""
    import xml.etree.ElementTree as ElementTree

    merged = ElementTree.Element("testsuites")
    for part in parts:
        if part.exists():
            merged.extend(ElementTree.parse(part).getroot().iter("testsuite"))
    ElementTree.ElementTree(merged).write(target, encoding="utf-8", xml_declaration=True)


@nox.session(allow_parallel=True)
@nox.parametrize("release", [nox.param(name, tags=["ci"]) for name in TORCH_RELEASES])
@timed
def torch_versions(session: nox.Session, release: str) -> None:
    """A subset touching every torch API accel uses, on three torch releases beside the pinned one.

    ``oldest`` is the torch every package declares (2.4), ``middle`` one teams run (2.6) and
    ``newest`` the newest on PyPI. Each leg first shows that a user's ``pip install`` of the six
    packages into a venv holding that torch keeps it (:func:`pip_install_keeps_torch`); the
    oldest leg also checks that every package's ``torch>=`` equals the torch it tests. The
    subset (``constraints/torch-versions-subset.txt``) then runs one pytest per test folder,
    the counts of each printed at the end; tests of gated features skip with the gate's message.
    """
    version = pinned_torch(release)
    if release == "oldest":
        minor = ".".join(version.split(".")[:2])  # torch==2.6.0 is what torch>=2.6 resolves to
        bounds = declared_torch_bounds()
        if set(bounds.values()) != {minor} or set(bounds) != set(PACKAGES):
            session.error(
                f"constraints/{TORCH_RELEASES[release]} pins torch=={version}, but the packages "
                f"declare {bounds}: make every pyproject say torch>={minor} (what this leg "
                "tests), or pin the oldest torch they declare"
            )
    constraints = torch_release_constraints(session, release)
    pip_install_keeps_torch(session, release, version)
    targets = package_targets(PACKAGES)
    if release_numbers(version) < TORCHFT_MIN_TORCH:
        targets = [
            str(PACKAGES_DIR / "accel-launch") if "accel-launch[" in target else target
            for target in targets
        ]
    session.install(
        "-c",
        constraints,
        *targets,
        *TEST_TOOLS,
        "scikit-learn",
        *deepspeed_wheel(session, constraints, TORCH_LEG_DEEPSPEED_OPS),
    )
    found = venv_torch(session)
    if found is not None and found != version:  # None: --install-only
        session.error(f"torch_versions({release}): the venv has torch {found!r}, not {version}")
    tmp = Path(session.create_tmp())
    parts: list[Path] = []
    try:
        for folder, node_ids in torch_subset_groups().items():
            label = folder.parent.name if folder.name == "tests" else folder.name
            parts.append(tmp / f"junit-{label}.xml")
            parts[-1].unlink(missing_ok=True)
            session.run(
                "pytest",
                *node_ids,
                "-p",
                "no:cacheprovider",
                f"--junitxml={parts[-1]}",
                *session.posargs,
                env=cpu_env(session),
            )
    finally:
        JUNIT_DIR.mkdir(parents=True, exist_ok=True)
        merge_junit(parts, junit_path(session))
        for part in parts:
            counts = session_times.read_junit_counts(part) if part.exists() else None
            label = part.stem.removeprefix("junit-")
            session.log(f"torch {version}: {label}: {counts} (passed/failed/skipped)")


def peer_install(session: nox.Session, release: str) -> str:
    """accel and the peer test dependencies on ``release``'s torch; returns the constraints."""
    constraints = (
        CONSTRAINTS["cpu"] if release == "pinned" else torch_release_constraints(session, release)
    )
    session.install(
        "-c",
        constraints,
        *package_targets(PACKAGES, extras="fsdp"),
        *PEER_SCRIPT_DEPENDENCIES,
        *PEER_UNIT_DEPENDENCIES,
    )
    return constraints


def peer_unit_expectations(release: str) -> list[str]:
    """The ``--expect-fail`` arguments of ``release``'s expected failures."""
    expected = {
        **PEER_UNIT_EXPECTED_FAILURES,
        **PEER_UNIT_EXPECTED_FAILURES_BY_RELEASE.get(release, {}),
    }
    return [f"--expect-fail={name}={why}" for name, why in expected.items()]


def peer_reference_file(release: str) -> Path:
    """Where Accelerate's recorded unit-suite outcomes on ``release``'s torch are kept."""
    return PEER_REFERENCE_DIR / f"accelerate-1.15.0-{release}.json"


# Each launch here takes a free port, so the session can run beside any other under --parallel.
@nox.session(allow_parallel=True)
@nox.parametrize("release", [nox.param(name, tags=["ci"]) for name in PEER_RELEASES])
@timed
def peer(session: nox.Session, release: str) -> None:
    """Accelerate 1.15's own test scripts and unit suite, renamed to accel, on the CPU.

    The scripts (scripts/peer_scripts.py) run on 1 and 2 processes from the pinned wheel; the unit
    suite (scripts/peer_unit_tests.py) runs from the pinned sdist on accel and is compared test by
    test with Accelerate's own outcomes of it, recorded by ``peer_reference`` in
    ``scripts/peer_reference/`` with the versions of its venv: the session fails, naming that
    session, when it installs other versions (a release with no record yet runs the suite on
    Accelerate in a second venv, as before). Both downloads are kept in ~/.cache/accel-peer
    (sha256 checked) and only read. Arguments go to the scripts' runner.

    ``pinned`` runs both on ``constraints/cpu.txt``'s torch; ``oldest`` runs the unit suite on
    the oldest torch the packages declare (``constraints/torch-oldest.txt``).
    """
    constraints = peer_install(session, release)
    peer_env = {**cpu_env(session), **PEER_OFFLINE_ENV}
    if release == "pinned":
        session.run(
            "python", str(ROOT / "scripts" / "peer_scripts.py"), *session.posargs, env=peer_env
        )
    record = peer_reference_file(release)
    if record.exists():
        baseline = ["--baseline-outcomes", str(record)]
    else:  # until `peer_reference` has recorded this release: Accelerate runs live
        session.log(f"peer: no {record.name}: running Accelerate's unit suite in a second venv")
        baseline = ["--baseline-python", peer_baseline_python(session, constraints, release)]
    session.run(
        "python",
        str(ROOT / "scripts" / "peer_unit_tests.py"),
        *baseline,
        f"--record-session=nox -s \"peer_reference(release='{release}')\"",
        *peer_unit_expectations(release),
        env=peer_env,
    )


@nox.session
@nox.parametrize("release", list(PEER_RELEASES))
@timed
def peer_reference(session: nox.Session, release: str) -> None:
    """Record Accelerate 1.15's outcomes of its own unit suite on ``release``'s torch (not CI).

    Runs the suite on Accelerate in a second venv (the peer venv's versions) and on accel,
    compares them as ``peer`` does, and writes Accelerate's outcomes with its versions to
    ``scripts/peer_reference/``: commit the file. Run it after changing a pin ``peer`` names.
    """
    constraints = peer_install(session, release)
    session.run(
        "python",
        str(ROOT / "scripts" / "peer_unit_tests.py"),
        "--baseline-python",
        peer_baseline_python(session, constraints, release),
        "--record",
        str(peer_reference_file(release)),
        *peer_unit_expectations(release),
        env={**cpu_env(session), **PEER_OFFLINE_ENV},
    )


@nox.session
@timed
def peer_baseline(session: nox.Session) -> None:
    """The same scripts on Hugging Face Accelerate 1.15.0 itself, in a venv of its own."""
    session.install("-c", CONSTRAINTS["cpu"], "accelerate==1.15.0", *PEER_SCRIPT_DEPENDENCIES)
    session.run(
        "python",
        str(ROOT / "scripts" / "peer_scripts.py"),
        "--target",
        "accelerate",
        *session.posargs,
        env={**cpu_env(session), **PEER_OFFLINE_ENV},
    )


# The runtime dependencies Accelerate declares that libraries on top of it use (psutil for
# transformers' memory metrics, numpy for its Trainer and torch's object collectives): the
# install of accel brings them (checked by the install session).
ACCEL_RUNTIME_MODULES = ("psutil", "numpy", "yaml", "safetensors", "tqdm")


@nox.session(tags=["ci"], reuse_venv=False, allow_parallel=True)
@nox.parametrize("install", list(INSTALLS))
@timed
def install(session: nox.Session, install: str) -> None:
    """A user's install, nothing else: a fresh venv with the pinned torch and one ``pip install``.

    No test tools and no extras, so a module the packages use but do not declare fails here. An
    install of ``accel`` must bring the runtime dependencies Accelerate declares
    (:data:`ACCEL_RUNTIME_MODULES`: psutil, numpy...); the others are checked to hold no numpy,
    which they do not need. Then the install's script runs on 2 processes (see
    tests-integration/install/README.md).
    """
    packages, command = INSTALLS[install]
    session.install("-c", CONSTRAINTS["cpu"], *(str(PACKAGES_DIR / name) for name in packages))
    if "accel" in packages:
        # What Accelerate declares and libraries on top rely on (transformers' memory metrics
        # need psutil): a drop-in replacement brings them too.
        session.run(
            "python",
            "-c",
            "import importlib.util, sys; "
            f"missing = [m for m in {ACCEL_RUNTIME_MODULES!r} if not importlib.util.find_spec(m)]; "
            "sys.exit(f'accel did not bring {missing}' if missing else 0)",
        )
    else:
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
        session.run(*(part.format(tmp=tmp) for part in command), env=cpu_env(session))


# Accelerate is compared with, never run: installed without its dependencies, plus the two that
# importing accelerate and accelerate.utils needs beside what accel already brings.
API_COVERAGE_REQUIREMENTS = ["numpy", "packaging"]


@nox.session(tags=["ci"], allow_parallel=True)
@timed
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
    session.run(
        "python", str(ROOT / "scripts" / "api_coverage.py"), "--check", env=cpu_env(session)
    )


@nox.session(tags=["ci"], allow_parallel=True)
@timed
def lint(session: nox.Session) -> None:
    """ruff lint and format check; no import cycles; no process-wide state reads in accel's layers;
    Accelerate's module paths (doors) match their one table, ``packages/accel/doors.toml``."""
    session.install("-c", CONSTRAINTS["cpu"], "ruff")
    session.run("ruff", "check", str(ROOT))
    session.run("ruff", "format", "--check", str(ROOT))
    session.run("python", str(ROOT / "scripts" / "import_cycles.py"))
    session.run("python", str(ROOT / "scripts" / "state_reads.py"))
    session.run("python", str(ROOT / "scripts" / "doors.py"), "--check")


@nox.session(tags=["ci"], allow_parallel=True)
@timed
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every package's sources."""
    install_packages(session, "cpu", PACKAGES, "mypy")
    sources = [str(PACKAGES_DIR / name / "src") for name in PACKAGES]
    session.run("mypy", "--config-file", str(ROOT / "mypy.ini"), *sources)


DOCS_REQUIREMENTS = [
    "mkdocs",
    "mkdocs-material",
    "mkdocstrings",
    "mkdocstrings-python",
    "mkdocs-gen-files",
    "ruff",  # mkdocstrings formats signatures with it
]
# Quiet the notices MkDocs' plugins print about MkDocs' and Material's futures (see the note
# in mkdocs.yml); they are not warnings about the site.
DOCS_ENV = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


@nox.session(tags=["ci"], allow_parallel=True)
@timed
def docs(session: nox.Session) -> None:
    """Build the docs site strictly into ``site/`` and check it against the code.

    A broken link or reference fails the build; ``scripts/check_docs_site.py`` then fails on a
    flag, config key, variable or public name missing from its reference page, or a page
    missing from the nav's build or the search index.

    The reference pages are generated from the code (scripts/docs_reference.py): the command
    line from the parser, config keys from their dataclasses, variables from the launch
    contract, the API from the docstrings, and the Accelerate paths from scripts/api_coverage.py,
    which needs Accelerate installed (without its dependencies, as in ``api_coverage``).
    """
    session.install(
        "-c",
        CONSTRAINTS["cpu"],
        *package_targets(PACKAGES),
        *API_COVERAGE_REQUIREMENTS,
        *DOCS_REQUIREMENTS,
    )
    session.install("--no-deps", "accelerate==1.15.0")
    site = ROOT / "site"
    session.run(
        "mkdocs",
        "build",
        "--strict",
        "--config-file",
        str(ROOT / "mkdocs.yml"),
        "--site-dir",
        str(site),
        env={**cpu_env(session), **DOCS_ENV},
    )
    session.log(f"docs: built {site} with 0 warnings (the build is strict)")
    session.run(
        "python", str(ROOT / "scripts" / "check_docs_site.py"), str(site), env=cpu_env(session)
    )


@nox.session
@nox.parametrize("accelerate", [False, True])
@timed
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
@timed
def demo(session: nox.Session) -> None:
    """Train the digits example on 2 CPU processes through accel launch (about a minute)."""
    install_packages(session, "cpu", PACKAGES, "scikit-learn")
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


# Defined last, so that `nox -t ci` (definition order) and a plain `nox` run it after the rest.
@nox.session(python=False, tags=["ci"])
def ci_times(session: nox.Session) -> None:
    """Print each earlier session's wall time, result and test counts; write .nox/ci-times.json.

    Reports what the sessions before it in the same nox run recorded (those run by
    ``--parallel`` too); never fails.
    """
    wall_seconds = time.time() - RUN_STARTED
    times = session_times.load_records(SESSION_RECORDS, RUN_STARTED)
    if not times:
        session.log(
            "ci_times: no session of this nox run recorded its time before this one (run it"
            " after others: nox -t ci, or nox -s lint ci_times)"
        )
        return
    try:
        print(session_times.format_table(times, wall_seconds), flush=True)
        session_times.write_report(CI_TIMES_JSON, times, wall_seconds)
        session.log(f"ci_times: wrote {CI_TIMES_JSON}")
    except Exception as error:  # noqa: BLE001 - a report must not fail the CI run it describes
        session.warn(f"ci_times: could not report the session times: {error!r}")
