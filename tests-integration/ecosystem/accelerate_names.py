"""Every Accelerate name that transformers, PEFT and TRL use, read from their installed source.

The libraries are parsed, never imported: each ``from accelerate... import name`` and each
``accelerate.<module>.<name>`` reached through ``import accelerate`` becomes a key
``"accelerate.<module>:<name>"``, with the source lines where the library *uses* it (not where it
imports it). ``name_use_recorder.py`` watches those lines in a running job, so a test can show
that the library's own code reached each name.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

LIBRARIES = ("transformers", "peft", "trl")
ROOT_MODULE = "accelerate"


@dataclass
class NameUses:
    """Where one Accelerate name is imported and used in the libraries' source."""

    imported_in: set[str] = field(default_factory=set)
    #: ``{file: sorted line numbers}`` of the lines that use the name; files are named from the
    #: folder that holds the libraries (``transformers/trainer.py``), so a venv with another
    #: copy of the same versions (Accelerate's, for comparison) finds them too.
    lines: dict[str, list[int]] = field(default_factory=dict)

    def add_use(self, path: str, line: int) -> None:
        self.lines.setdefault(path, [])
        if line not in self.lines[path]:
            self.lines[path].append(line)
            self.lines[path].sort()


def library_root(library: str) -> Path:
    """The installed package folder of ``library``."""
    spec = importlib.util.find_spec(library)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{library} is not installed in {importlib.util.__file__}")
    return Path(spec.origin).parent


def _is_accelerate(module: str | None) -> bool:
    return module is not None and (module == ROOT_MODULE or module.startswith(f"{ROOT_MODULE}."))


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    parts: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    parts.append(current.id)
    return parts[::-1]


class _FileScanner:
    """Collects one file's Accelerate imports and the lines that use what they bind."""

    def __init__(self, path: str, found: dict[str, NameUses]) -> None:
        self.path = path
        self.found = found
        self._parents: dict[int, ast.AST] = {}

    def scan(self, tree: ast.Module) -> None:
        self._parents = {
            id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)
        }
        self._scan_scope(tree)

    def _scan_scope(self, scope: ast.AST) -> None:
        """Imports made directly in ``scope`` bind names used anywhere inside ``scope``."""
        names: dict[str, str] = {}  # local name -> key
        modules: set[str] = set()  # local names bound to accelerate itself
        for node in _own_nodes(scope):
            if isinstance(node, ast.ImportFrom) and _is_accelerate(node.module):
                for alias in node.names:
                    key = f"{node.module}:{alias.name}"
                    self.found.setdefault(key, NameUses()).imported_in.add(self.path)
                    names[alias.asname or alias.name] = key
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_accelerate(alias.name):
                        modules.add(alias.asname or ROOT_MODULE)
        if names or modules:
            self._collect_uses(scope, names, modules)
        for node in _own_nodes(scope):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._scan_scope(node)

    def _collect_uses(self, scope: ast.AST, names: dict[str, str], modules: set[str]) -> None:
        for node in ast.walk(scope):
            if isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load):
                self.found[names[node.id]].add_use(self.path, node.lineno)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                chain = _attribute_chain(node)
                if chain is None or chain[0] not in modules or len(chain) < 2:
                    continue
                # Only the outermost attribute of a chain names something: skip inner pieces.
                key = f"{'.'.join([ROOT_MODULE, *chain[1:-1]])}:{chain[-1]}"
                parent = self._parents.get(id(node))
                if not (isinstance(parent, ast.Attribute) and parent.value is node):
                    uses = self.found.setdefault(key, NameUses())
                    uses.imported_in.add(self.path)
                    uses.add_use(self.path, node.lineno)


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of ``scope`` outside any nested function (class bodies and blocks included)."""
    nodes: list[ast.AST] = []
    pending = list(ast.iter_child_nodes(scope))
    while pending:
        node = pending.pop()
        nodes.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))
    return nodes


def imported_names(libraries: tuple[str, ...] = LIBRARIES) -> dict[str, NameUses]:
    """Every Accelerate name the installed ``libraries`` import, with the lines that use it."""
    found: dict[str, NameUses] = {}
    for library in libraries:
        root = library_root(library)
        for path in sorted(root.rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if ROOT_MODULE not in text:
                continue
            relative = path.relative_to(root.parent).as_posix()
            _FileScanner(relative, found).scan(ast.parse(text, filename=str(path)))
    return dict(sorted(found.items()))


def write_sites(path: Path, names: dict[str, NameUses]) -> None:
    """Store ``{key: {file: lines}}`` for ``name_use_recorder`` in a job."""
    path.write_text(json.dumps({key: uses.lines for key, uses in names.items()}))


if __name__ == "__main__":
    for key, uses in imported_names().items():
        where = {Path(f).name: lines for f, lines in uses.lines.items()}
        print(key, where or f"(never used; imported in {sorted(uses.imported_in)})")
