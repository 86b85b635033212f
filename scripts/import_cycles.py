"""Find import cycles between the modules of every package under ``packages/`` (``nox -s lint``).

Every ``import`` and ``from ... import`` counts, at module level or inside a function, except those
under ``if TYPE_CHECKING:`` (types only, never executed). A module importing its own parent package
(``accel.x`` importing from ``accel``) is not counted: a package's ``__init__`` re-exports its
modules by design. Prints each cycle (a strongly connected group of modules) and exits 1 when
there is one.

The same run keeps the backend folders of ``accel.strategies`` apart (:data:`BACKENDS`; the
allowed edges are listed with their reason in :data:`BACKEND_EDGES`), and keeps Accelerate's
module paths doors: the modules of :data:`DOORS` only re-export,
and nothing outside them imports one of them (the one-way direction holds inside ``accel`` as it
does between packages). Each import into a door from elsewhere is printed with its file and line,
and the run exits 1::

    python scripts/import_cycles.py
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Accelerate's module paths in ``accel`` that re-export only (a name ending in ``.*``: every
#: module below it). Their code lives in the domain modules they import from; their names are
#: written from ``packages/accel/doors.toml`` by ``scripts/doors.py``.
DOORS = (
    "accel.utils",
    "accel.utils.*",
    "accel.big_modeling",
    "accel.data_loader",
    "accel.hooks",
    "accel.launchers",
    "accel.memory_utils",
    "accel.state",
    "accel.test_utils",
    "accel.tracking",
    # Accelerate's own test scripts, run by ``accel test``: at the top, imported by nothing.
    "accel.test_utils.scripts",
    "accel.test_utils.scripts.*",
)


def module_files(root: Path = ROOT / "packages") -> dict[str, Path]:
    """Dotted module name -> file, for every module of every package's ``src`` folder."""
    modules: dict[str, Path] = {}
    for source in sorted(root.glob("*/src")):
        for path in sorted(source.rglob("*.py")):
            parts = list(path.relative_to(source).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (``if TYPE_CHECKING:`` bodies skipped)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for other in node.orelse:
                yield from _imports(other)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _imports(node)


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports (parents of itself excluded)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in _imports(tree):
            for target in _targets(node, name, is_package):
                if target in modules and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (Tarjan's SCCs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def is_door(name: str, doors: tuple[str, ...] = DOORS) -> bool:
    """Whether module ``name`` is one of Accelerate's module paths that only re-export."""
    return any(
        name.startswith(door[:-1]) if door.endswith(".*") else name == door for door in doors
    )


def door_imports(modules: dict[str, Path]) -> list[tuple[str, int, str]]:
    """``(file, line, door)`` for every import of a door by a module that is not a door."""
    found: list[tuple[str, int, str]] = []
    for name, path in modules.items():
        if is_door(name):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in _imports(tree):
            targets = _targets(node, name, is_package)
            doors = sorted({t for t in targets if t in modules and is_door(t)})
            if doors and not name.startswith(doors[0] + "."):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                found.append((str(where), node.lineno, doors[0]))
    return sorted(found)


#: accel's backend folders: each holds one strategy with its plugin, settings and I/O. None
#: imports another; what two share lives below them (``accel.strategies.base`` and siblings).
BACKENDS = ("ddp", "deepspeed", "fsdp", "mesh", "xla")
#: The allowed edges between backend folders, with the reason.
BACKEND_EDGES = {
    ("mesh", "fsdp"): "the N-D strategy is FSDP2 on a mesh: MeshStrategy extends FSDPStrategy",
}


def _backend(name: str) -> str | None:
    parts = name.split(".")
    if parts[:2] == ["accel", "strategies"] and len(parts) > 2 and parts[2] in BACKENDS:
        return parts[2]
    return None


def backend_crossings(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(module, imported)`` for each import from one backend folder into another."""
    found = []
    for name, targets in graph.items():
        source = _backend(name)
        for target in targets:
            destination = _backend(target)
            crosses = source and destination and source != destination
            if crosses and (source, destination) not in BACKEND_EDGES:
                found.append((name, target))
    return sorted(found)


def main() -> int:
    """Print the cycles, imports into doors and between backends; 0 when there are none."""
    modules = module_files()
    found = cycles(import_graph(modules))
    for group in found:
        print("import cycle: " + " <-> ".join(group))
    print(f"import cycles: {len(found)} among {len(modules)} modules")
    into_doors = door_imports(modules)
    for where, line, door in into_doors:
        print(f"{where}:{line}: imports {door}, a re-export door; import from its domain module")
    print(f"imports into doors from outside them: {len(into_doors)}")
    crossings = backend_crossings(import_graph(modules))
    for name, target in crossings:
        print(f"{name} imports {target}: backend folders do not import each other")
    print(f"imports between backend folders: {len(crossings)}")
    return 1 if found or into_doors or crossings else 0


if __name__ == "__main__":
    sys.exit(main())
