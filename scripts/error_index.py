"""The error index: every exception class accel's packages define, and every message they raise.

Read statically from the sources (nothing is imported): each package's exception hierarchy under
its root class, each class's docstring (what it means), and every ``raise SomeError(...)`` with
its message as written (``{...}`` stands for what is filled in at run time) and where it is.
``scripts/docs_reference.py`` renders it as ``reference/errors.md``; ``python
scripts/error_index.py`` prints the same markdown.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import sys
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Each package's import name and the root of its exception hierarchy.
ROOTS = {
    "accel_state": "AccelStateError",
    "accel_ops": "AccelOpsError",
    "accel_data": "AccelDataError",
    "accel_ckpt": "AccelCkptError",
    "accel_launch": "AccelLaunchError",
    "accel": "AccelError",
}
#: The packages' folders, by import name.
FOLDERS = {name: ROOT / "packages" / name.replace("_", "-") / "src" / name for name in ROOTS}


@dataclasses.dataclass
class RaiseSite:
    """One ``raise`` of an error class: the message as written, and where."""

    message: str
    where: str


@dataclasses.dataclass
class ErrorClass:
    """One exception class of a package: its bases, its docstring and where it is raised."""

    name: str
    package: str
    module: str
    bases: list[str]
    doc: str
    raised: list[RaiseSite] = dataclasses.field(default_factory=list)


def source_files(package: str) -> Iterator[tuple[str, pathlib.Path]]:
    """Each module of ``package`` with its dotted name."""
    folder = FOLDERS[package]
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder.parent).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def base_name(node: ast.expr) -> str:
    """The class name a base expression refers to (``errors.Foo`` -> ``Foo``)."""
    return node.attr if isinstance(node, ast.Attribute) else ast.unparse(node)


def message_text(node: ast.expr) -> str:
    """A message argument as a reader sees it: literal text, ``{...}`` for what is computed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value if isinstance(part, ast.Constant) else "{" + ast.unparse(part.value) + "}"
            for part in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return message_text(node.left) + message_text(node.right)
    return "{" + ast.unparse(node) + "}"


def collect() -> list[ErrorClass]:
    """Every error class of every package, with its raise sites."""
    classes: dict[tuple[str, str], ErrorClass] = {}
    trees: list[tuple[str, str, pathlib.Path, ast.Module]] = []
    for package in ROOTS:
        for module, path in source_files(package):
            tree = ast.parse(path.read_text(), filename=str(path))
            trees.append((package, module, path, tree))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(
                        (package, node.name),
                        ErrorClass(
                            name=node.name,
                            package=package,
                            module=module,
                            bases=[base_name(base) for base in node.bases],
                            doc=ast.get_docstring(node) or "",
                        ),
                    )
    errors = {key: value for key, value in classes.items() if derives_from_root(key, classes)}
    by_name = {name: error for (_, name), error in errors.items()}
    for package, _, path, tree in trees:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            name = base_name(node.exc.func)
            error = errors.get((package, name)) or by_name.get(name)
            if error is None:
                continue
            arguments = node.exc.args
            message = message_text(arguments[0]) if arguments else "(the message its class builds)"
            where = f"{path.relative_to(ROOT / 'packages').as_posix()}:{node.lineno}"
            error.raised.append(RaiseSite(message=" ".join(message.split()), where=where))
    return sorted(errors.values(), key=lambda error: (list(ROOTS).index(error.package), error.name))


def derives_from_root(key: tuple[str, str], classes: dict[tuple[str, str], ErrorClass]) -> bool:
    """Whether the class ``key`` is its package's root error or derives from any package's root."""
    roots = set(ROOTS.values())
    seen: set[tuple[str, str]] = set()
    pending = [key]
    while pending:
        current = pending.pop()
        if current in seen or current not in classes:
            continue
        seen.add(current)
        if current[1] in roots:
            return True
        for base in classes[current].bases:
            pending += [(current[0], base), *((package, base) for package in ROOTS)]
    return False


#: Characters markdown would read as markup in a message, and the entity that shows each as is.
LITERAL = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    "|": "&#124;",
    "`": "&#96;",
    "*": "&#42;",
    "_": "&#95;",
    "[": "&#91;",
    "]": "&#93;",
    "\\": "&#92;",
}


def cell(text: str) -> str:
    """A message as plain text for one markdown table cell: shown as written, wrapping freely."""
    return "".join(LITERAL.get(character, character) for character in " ".join(text.split()))


def where_cell(where: str) -> str:
    """``file:line`` as inline code that wraps after its slashes only."""
    return "<code>" + "/<wbr>".join(where.split("/")) + "</code>"


def render(errors: list[ErrorClass]) -> str:
    """The error index as markdown: a section per package, a table of messages per class."""
    sites = sum(len(error.raised) for error in errors)
    lines = [
        "# Error index",
        "",
        f"Every exception class accel's packages define ({len(errors)}) and every message they "
        f"raise ({sites} places), read from the source code when the site is built, so that it "
        "cannot drift from it. Each package's errors derive from one root class, and each also "
        "derives from the built-in exception that code written for Accelerate catches "
        "(`ValueError`, `RuntimeError`, `FileNotFoundError`...). `{...}` in a message stands "
        "for what is filled in when it is raised. The message names the argument, the value and "
        "the fix; [Troubleshooting](../guides/troubleshooting.md) covers failures that raise "
        "no error, such as hangs.",
        "",
    ]
    for package in ROOTS:
        lines += [f"## `{package}`", ""]
        for error in (error for error in errors if error.package == package):
            bases = ", ".join(f"`{base}`" for base in error.bases)
            lines += [f"### `{error.name}`", "", f"`{error.module}.{error.name}` ({bases})", ""]
            if error.doc:
                lines += [error.doc.split("\n\n")[0], ""]
            if error.raised:
                lines += ["| message | raised in |", "| --- | --- |"]
                raised = sorted(error.raised, key=lambda site: site.where)
                lines += [f"| {cell(site.message)} | {where_cell(site.where)} |" for site in raised]
            else:
                lines.append("Raised through its subclasses, or caught as a group.")
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render(collect()))
