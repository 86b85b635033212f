"""DeepSpeed with its CPU ops compiled in, built once per torch release and shared by every venv.

DeepSpeed compiles its C++ ops the first time a process uses them (JIT, about a minute of both
cores each), into a folder that only one venv can use: the build arguments hold the venv's own
paths. Every test venv that ran DeepSpeed paid for them again, inside whichever test came
first. Installed from a wheel built with ``DS_BUILD_<OP>=1`` (DeepSpeed's documented
ahead-of-time install), DeepSpeed loads the compiled ops and builds nothing.

The noxfile builds that wheel once per (DeepSpeed, torch, Python) into a cache folder that
outlives the venvs (``$ACCEL_DEEPSPEED_OPS_CACHE``, else ``~/.cache/accel-deepspeed-ops``),
under a file lock so that sessions run by ``nox --parallel`` build it once, and installs it from
there with ``--find-links``. :func:`built_extensions` lets a session check afterwards that no
test compiled an op after all. Standard library only: the noxfile imports it into nox's own
interpreter.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import os
import re
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

#: The ops accel's tests use on the CPU, by DeepSpeed's op name: the shared-memory collectives
#: every CPU job loads at start, the C++ Adam of offloaded ZeRO and the CPU FusedAdam.
ALL_OPS = ("deepspeed_shm_comm", "cpu_adam", "fused_adam")
#: Each op's ``DS_BUILD_*`` switch (setup.py compiles the ops whose switch is 1).
BUILD_SWITCHES = {
    "deepspeed_shm_comm": "DS_BUILD_SHM_COMM",
    "cpu_adam": "DS_BUILD_CPU_ADAM",
    "fused_adam": "DS_BUILD_FUSED_ADAM",
}


def cache_base() -> Path:
    """Where the built wheels are kept: ``$ACCEL_DEEPSPEED_OPS_CACHE`` or the user's cache."""
    configured = os.environ.get("ACCEL_DEEPSPEED_OPS_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "accel-deepspeed-ops"


def pinned(constraints: Path, name: str) -> str:
    """The version ``constraints`` pins for ``name`` (its ``name==X`` line; the last one wins).

    Raises:
        ValueError: The file pins no such version.
    """
    found = None
    for line in constraints.read_text().splitlines():
        match = re.fullmatch(rf"{re.escape(name)}==([^\s;#]+)", line.strip(), flags=re.IGNORECASE)
        if match:
            found = match.group(1)
    if found is None:
        raise ValueError(f"{constraints} pins no {name} (add a line {name}==<version>)")
    return found


def wheel_folder(deepspeed: str, torch: str, python_tag: str, ops: Sequence[str]) -> Path:
    """The cache folder of one build: DeepSpeed, torch and Python versions and the ops in it."""
    unknown = sorted(set(ops) - set(BUILD_SWITCHES))
    if unknown:
        raise ValueError(f"ops={unknown} are not ones this build knows: {sorted(BUILD_SWITCHES)}")
    op_part = "+".join(sorted(ops))
    return cache_base() / f"deepspeed-{deepspeed}-torch-{torch}-{python_tag}-cpu-{op_part}"


def built_wheel(folder: Path) -> Path | None:
    """The wheel in ``folder``, if a build finished there."""
    wheels = sorted(folder.glob("deepspeed-*.whl")) if folder.is_dir() else []
    return wheels[0] if wheels else None


def check_wheel(wheel: Path, ops: Sequence[str], torch: str) -> None:
    """Check that ``wheel`` holds ``ops`` compiled against ``torch`` (its major.minor).

    DeepSpeed's setup.py records what it compiled in ``git_version_info_installed.py``; a
    compiler or an op that could not be built leaves an op out without failing the build.

    Raises:
        ValueError: An op is missing, or the wheel was built against another torch.
    """
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read("deepspeed/git_version_info_installed.py").decode()
    recorded = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    installed = recorded.get("installed_ops")
    torch_info = recorded.get("torch_info")
    built = {name for name, on in installed.items() if on} if isinstance(installed, dict) else set()
    missing = sorted(set(ops) - built)
    if missing:
        raise ValueError(f"{wheel.name} was built without {missing} (it has {sorted(built)})")
    found = torch_info.get("version") if isinstance(torch_info, dict) else None
    wanted = ".".join(torch.split(".")[:2])
    if found != wanted:
        raise ValueError(f"{wheel.name} was built against torch {found}, not {wanted}")


def build_env(ops: Sequence[str], jobs: int) -> dict[str, str]:
    """The variables that make DeepSpeed's setup.py compile ``ops`` for its CPU accelerator."""
    env = {"DS_BUILD_OPS": "0", "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    env.update({BUILD_SWITCHES[op]: "1" for op in ops})
    env["MAX_JOBS"] = str(jobs)  # torch's extension builder runs this many compilers at once
    return env


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock for building into ``folder`` (released when the holder dies)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def built_extensions(extensions_dir: Path) -> list[str]:
    """The DeepSpeed ops compiled into a ``TORCH_EXTENSIONS_DIR`` (a test built one at run time).

    torch builds each extension into ``<dir>/<name>`` (or ``<dir>/<python>_<variant>/<name>``);
    a finished build leaves a shared library there.
    """
    if not extensions_dir.is_dir():
        return []
    return sorted({path.parent.name for path in extensions_dir.rglob("*.so")})
