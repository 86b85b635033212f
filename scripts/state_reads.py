"""Keep the process-wide state out of accel's layers (``nox -s lint``).

Settings are resolved once into :class:`accel.run_config.RunConfig` and handed down. This check
fails when a module of ``accel`` outside the state modules constructs ``AcceleratorState()`` or
``GradientState()`` (which returns the process's shared record) or touches a ``_shared_*`` member.
Each allowed module is listed with the reason it may::

    python scripts/state_reads.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from import_cycles import ROOT, module_files

#: Modules that may read the process-wide state, and why.
ALLOWED = {
    "accel.accelerator_state": "the state module: builds AcceleratorState over its record",
    "accel.strategies.deepspeed.named_plugins": "AcceleratorState's DeepSpeed members: owns the plugin registry",
    "accel.accelerator": "resolves the state once into the RunConfig it hands down",
    "accel.optimizer": "Accelerate's AcceleratedOptimizer, also built standalone by scripts",
    "accel.scheduler": "Accelerate's AcceleratedScheduler, also built standalone by scripts",
    "accel.logging": "Accelerate's get_logger: asks whether the process state exists yet",
}
#: Folders of user scripts (Accelerate's test scripts) that use the public API as users do.
SCRIPT_FOLDERS = ("accel.test_utils.scripts",)
STATE_CLASSES = frozenset({"AcceleratorState", "GradientState"})


def state_reads(path: Path) -> list[tuple[int, str]]:
    """``(line, what)`` for every state construction or ``_shared_*`` access in ``path``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in STATE_CLASSES:
                found.append((node.lineno, f"{name}()"))
        if isinstance(node, ast.Attribute) and node.attr.startswith("_shared_"):
            found.append((node.lineno, f".{node.attr}"))
    return found


def main() -> int:
    """Print each forbidden read with its file and line; 1 when there is one."""
    problems = 0
    for module, path in module_files().items():
        if not module.startswith("accel."):
            continue
        if module in ALLOWED or module.startswith(SCRIPT_FOLDERS):
            continue
        for line, what in state_reads(path):
            problems += 1
            print(
                f"{path.relative_to(ROOT)}:{line}: {what} reads the process-wide state; take the "
                "setting from the RunConfig (or the object) the caller hands down"
            )
    print(f"process-wide state reads outside the state modules: {problems}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
