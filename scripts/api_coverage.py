"""List Hugging Face Accelerate's public names and their status in accel (the docs' coverage page).

Every module path of Accelerate (``accelerate`` and each one ``pkgutil.walk_packages`` finds below
it) is compared with its ``accel`` twin (``accelerate.utils.modeling`` -> ``accel.utils.modeling``),
and so is the ``Accelerator`` class. A module's names are its ``__all__`` where it defines one,
else what it defines at top level (functions, classes, assignments; ``_private`` ones left out),
the names a package (``__init__``) imports, the imported names scripts are known to reach there
(:data:`~api_coverage_reasons.REACHED_IMPORTS`) and a few private names Accelerate's tests use
(:data:`~api_coverage_reasons.PRIVATE_NAMES`). Each name is classified:

* **same**: present, and every parameter / dataclass field / enum member of Accelerate's version
  exists in accel's;
* **differs**: present, but something is missing (listed automatically) or behaves differently
  (reason in ``NOTES``);
* **absent**: not in accel; the reason comes from ``NOTES`` or ``ABSENT_PATTERNS``.

Where Accelerate's name is a re-export (the same object as under another module path, such as
``accelerate.utils.X is accelerate.utils.dataclasses.X``), accel's must be the same object too;
a name that is not is reported as **not the same object**. Each module path's twin imports,
imports once an optional library is installed (as Accelerate's does), is listed in
``SUBMODULE_REASONS``, or fails.

Run it in a venv with accel and Accelerate installed (Accelerate is not a dependency)::

    uv pip install --no-deps accelerate==1.15.0   # plus numpy and packaging
    python scripts/api_coverage.py            # print the markdown
    python scripts/api_coverage.py --check    # exit 1 on an unexplained gap
    python scripts/api_coverage.py --absent FILE --signatures FILE   # full lists, one a line

The docs site renders the same markdown as its "Accelerate API coverage" page when it is built
(``scripts/docs_reference.py``). Reasons live in ``api_coverage_reasons.py``, nowhere else.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib
import importlib.util
import inspect
import os
import pathlib
import pkgutil
import re
import sys
import types
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from api_coverage_reasons import (
    ABSENT_PATTERNS,
    NOTES,
    PRIVATE_NAMES,
    REACHED_IMPORTS,
    SUBMODULE_REASONS,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Where a re-exported object is documented, in order of preference: accel's object there is the
# one every other module path of accel must hand out.
DOCUMENTED = ("accelerate", "accelerate.utils", "accelerate.test_utils")
# Values whose identity means nothing (equal constants may be distinct objects).
IMMUTABLE = (str, bytes, int, float, complex, bool, tuple, frozenset, type(None))

__all__ = [
    "ABSENT_PATTERNS",
    "NOTES",
    "PRIVATE_NAMES",
    "REACHED_IMPORTS",
    "SUBMODULE_REASONS",
    "Entry",
    "Submodule",
    "classify",
    "classify_submodule",
    "collect",
    "collect_submodules",
    "compare",
    "main",
    "module_names",
    "module_rows",
    "render",
]


@dataclasses.dataclass
class Entry:
    """One public name of one Accelerate module (or of ``Accelerator``) and its status in accel.

    ``declared`` is set when the status comes from a :data:`NOTES` entry of this name under any
    module path of the same object. ``reference`` is set where Accelerate's object is a re-export
    and accel's is not: the accel name (``accel.utils.X``) that this one should be the same object
    as, when accel's is a different object or is absent here although accel has it there.
    """

    namespace: str
    name: str
    status: str
    note: str
    declared: bool = False
    reference: str = ""


@dataclasses.dataclass
class Submodule:
    """One module path of Accelerate and whether its ``accel`` twin imports.

    ``status`` is ``imports``; ``needs`` (it imports once the optional library named in ``note``
    is installed, as Accelerate's does); ``listed`` (no twin, for the reason in ``note``); or
    ``fails`` (the import error in ``note``).
    """

    path: str
    status: str
    note: str


# ---------------------------------------------------------------- comparing one name
def _parameters(obj: Any) -> list[str] | None:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    return [
        name
        for name, parameter in signature.parameters.items()
        if name != "self"
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]


def _missing_parts(theirs: Any, ours: Any) -> str:
    """What Accelerate's object has that accel's lacks ('' when nothing)."""
    if isinstance(theirs, property) or isinstance(ours, property):
        return ""
    if inspect.isclass(theirs) and issubclass(theirs, enum.Enum):
        if not (inspect.isclass(ours) and issubclass(ours, enum.Enum)):
            return "not an enum in accel"
        missing = [m for m in theirs.__members__ if m not in ours.__members__]
        return f"lacks members {', '.join(missing)}" if missing else ""
    if dataclasses.is_dataclass(theirs) and inspect.isclass(theirs):
        if not dataclasses.is_dataclass(ours):
            return ""
        ours_fields = {field.name for field in dataclasses.fields(ours)}
        missing = [f.name for f in dataclasses.fields(theirs) if f.name not in ours_fields]
        return f"lacks fields {', '.join(missing)}" if missing else ""
    if callable(theirs) and callable(ours) and not inspect.ismodule(theirs):
        their_params, our_params = _parameters(theirs), _parameters(ours)
        if their_params is None or our_params is None:
            return ""
        missing = [name for name in their_params if name not in our_params]
        return f"lacks parameters {', '.join(missing)}" if missing else ""
    return ""


def _absent_reason(keys: Iterable[tuple[str, str]]) -> str:
    for namespace, name in keys:
        for namespace_pattern, name_pattern, reason in ABSENT_PATTERNS:
            if re.fullmatch(namespace_pattern, namespace) and re.fullmatch(name_pattern, name):
                return reason
    return ""


def classify(
    namespace: str,
    name: str,
    found: bool,
    theirs: Any,
    ours: Any,
    aliases: Iterable[tuple[str, str]] = (),
) -> Entry:
    """The status of one name (see the module docstring).

    ``aliases`` are the other (module path, name) pairs of Accelerate's object: a reason
    recorded under any of them counts for this one.
    """
    keys = [(namespace, name), *aliases]
    key = next((key for key in keys if key in NOTES), None)
    status, reason = NOTES[key] if key else ("", "")
    if not found:
        reason = reason or _absent_reason(keys)
        return Entry(namespace, name, "absent", reason, declared=key is not None)
    detail = _missing_parts(theirs, ours)
    if detail or status == "differs":
        note = "; ".join(part for part in (detail, reason) if part)
        return Entry(namespace, name, "differs", note, declared=status == "differs")
    return Entry(namespace, name, "same", "")


# ---------------------------------------------------------------- the names of one module
def _top_level(body: list[ast.stmt], found: dict[str, set[str]]) -> None:
    """Sort the names bound by module-level statements into defined / own / other imports."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found["defined"].add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                found["defined"].update(
                    leaf.id for leaf in ast.walk(target) if isinstance(leaf, ast.Name)
                )
        elif isinstance(node, ast.ImportFrom):
            own = node.level > 0 or (node.module or "").split(".")[0] == "accelerate"
            found["own" if own else "other"].update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found["other"].update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody"):
                _top_level(getattr(node, block, []), found)
            for handler in getattr(node, "handlers", []):
                _top_level(handler.body, found)


def _source(path: str) -> tuple[str, bool]:
    """The source text of Accelerate's module ``path`` and whether it is a package."""
    spec = importlib.util.find_spec(path)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return "", False
    return pathlib.Path(spec.origin).read_text(), spec.submodule_search_locations is not None


def module_names(path: str, module: types.ModuleType | None) -> list[str]:
    """The names of Accelerate's module ``path`` (see the module docstring).

    ``module`` is None where Accelerate's module does not import here (it needs a library
    this venv lacks): its names are then read from its source alone.
    """
    private = PRIVATE_NAMES.get(path, ())
    if module is not None and hasattr(module, "__all__"):
        return sorted({*module.__all__, *private})
    source, is_package = _source(path)
    bound: dict[str, set[str]] = {"defined": set(), "own": set(), "other": set()}
    _top_level(ast.parse(source).body, bound)
    reached = set(REACHED_IMPORTS.get(path, ()))
    names = bound["defined"] | (bound["own"] if is_package else bound["own"] & reached)
    names |= bound["other"] & reached
    chosen = {name for name in names if not name.startswith("_")} | set(private)
    if module is not None:
        # Names bound only on another platform or library version are not there; modules are
        # module paths of their own or, imported from elsewhere, count only where reached.
        values = {name: _lookup(module, name) for name in chosen}
        chosen = {
            name
            for name, (found, value) in values.items()
            if found and (not inspect.ismodule(value) or name in reached)
        }
    return sorted(chosen)


def _lookup(module: types.ModuleType, name: str) -> tuple[bool, Any]:
    """``module.name``, where ``name`` may be ``Class.attribute`` (read statically)."""
    head, _, member = name.partition(".")
    try:
        value = getattr(module, head)
        if member:
            value = inspect.getattr_static(value, member)
    except AttributeError:
        return False, None
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    return True, value


# ---------------------------------------------------------------- collecting every module
def _quiet() -> None:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    warnings.simplefilter("ignore")


def module_paths() -> tuple[list[str], list[str]]:
    """Accelerate's module paths (``accelerate`` first) and those ``walk_packages`` could not walk."""
    _quiet()
    import accelerate

    unwalkable: list[str] = []
    walked = pkgutil.walk_packages(accelerate.__path__, "accelerate.", onerror=unwalkable.append)
    return ["accelerate", *sorted(info.name for info in walked)], unwalkable


def twin(path: str) -> str:
    """The accel module path for Accelerate's ``path``."""
    return "accel" + path[len("accelerate") :]


def _import(path: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(path)
    except Exception:  # noqa: BLE001 (a module needing a missing library is read from source)
        return None


# (module path, name, found in accel, Accelerate's object, accel's object)
Row = tuple[str, str, bool, Any, Any]


def module_rows(path: str) -> list[Row]:
    """One :data:`Row` per name of Accelerate's module ``path``.

    Accelerate's object is None where its module does not import here (names read from source).
    """
    module = _import(path)
    ours_module = importlib.import_module(twin(path))
    rows = []
    for name in module_names(path, module):
        their_value = _lookup(module, name)[1] if module is not None else None
        found, ours = _lookup(ours_module, name)
        rows.append((path, name, found, their_value, ours))
    return rows


def _reference(group: list[tuple[str, str]], obj: Any) -> tuple[str, str]:
    """The documented (module path, name) of a re-exported object among ``group``.

    The first of :data:`DOCUMENTED` in ``group``, else the object's defining module, else the
    first path in sorted order.
    """
    defining = getattr(obj, "__module__", "")
    for preferred in (*DOCUMENTED, defining):
        for key in group:
            if key[0] == preferred:
                return key
    return min(group)


def _identity_groups(rows: list[Row]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """For each (path, name): the other (path, name) pairs holding the same Accelerate object."""
    by_id: dict[int, list[tuple[str, str]]] = {}
    for path, name, _, value, _ in rows:
        if not isinstance(value, IMMUTABLE) and not inspect.ismodule(value):
            by_id.setdefault(id(value), []).append((path, name))
    return {key: [k for k in group if k != key] for group in by_id.values() for key in group}


def compare(rows: list[Row]) -> list[Entry]:
    """Classify every row; names that are one Accelerate object share reasons and must agree.

    An absent name takes a reason recorded for its aliases only where accel lacks those too;
    where accel has one of them, the entry's ``reference`` names it (a re-export is missing).
    A present name whose accel object is not the documented alias's gets ``reference`` too.
    """
    aliases = _identity_groups(rows)
    ours = {(path, name): value for path, name, found, _, value in rows if found}
    entries = []
    for path, name, found, their_value, our_value in rows:
        others = aliases.get((path, name), [])
        elsewhere = [key for key in others if key in ours]
        reasons_from = others if found else [key for key in others if key not in ours]
        entry = classify(path, name, found, their_value, our_value, reasons_from)
        if elsewhere and (found or not entry.note):
            reference = _reference([(path, name), *elsewhere] if found else elsewhere, their_value)
            if not found or ours[reference] is not our_value:
                entry.reference = f"{twin(reference[0])}.{reference[1]}"
        entries.append(entry)
    return entries


def collect() -> tuple[str, list[Entry]]:
    """Accelerate's version and one :class:`Entry` per name of every module and ``Accelerator``."""
    _quiet()
    import accelerate

    import accel

    rows: list[Row] = []
    for path in module_paths()[0]:
        if classify_submodule(path, twin(path)).status == "imports":
            rows += module_rows(path)
    entries = compare(rows)

    instance = accel.Accelerator(cpu=True)
    for name in sorted(n for n in dir(accelerate.Accelerator) if not n.startswith("_")):
        theirs_member = inspect.getattr_static(accelerate.Accelerator, name)
        try:
            ours_member: Any = inspect.getattr_static(accel.Accelerator, name)
            found = True
        except AttributeError:
            found = hasattr(instance, name)
            ours_member = getattr(instance, name, None)
        if isinstance(theirs_member, (staticmethod, classmethod)):
            theirs_member = theirs_member.__func__
        if isinstance(ours_member, (staticmethod, classmethod)):
            ours_member = ours_member.__func__
        entries.append(classify("Accelerator", name, found, theirs_member, ours_member))
    return accelerate.__version__, entries


def _submodule_reason(path: str) -> str:
    for pattern, reason in SUBMODULE_REASONS:
        if re.fullmatch(pattern, path):
            return reason
    return ""


def classify_submodule(path: str, twin: str) -> Submodule:
    """Import ``twin`` (``accel.<path after accelerate>``) and classify ``path``.

    A path listed in :data:`SUBMODULE_REASONS` whose twin accel does provide is compared too.
    """
    reason = _submodule_reason(path)
    try:
        importlib.import_module(twin)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if reason and (twin == missing or twin.startswith(missing + ".")):
            return Submodule(path, "listed", reason)
        if missing and missing.split(".")[0] not in ("accel", "accelerate"):
            return Submodule(path, "needs", f"imports once `{missing}` is installed")
        return Submodule(path, "fails", f"{type(error).__name__}: {error}")
    except Exception as error:  # noqa: BLE001 (any import error is reported, not raised)
        return Submodule(path, "fails", f"{type(error).__name__}: {error}")
    return Submodule(path, "imports", "")


def collect_submodules() -> list[Submodule]:
    """Every module path under ``accelerate`` (``pkgutil.walk_packages``) and its accel twin."""
    paths, unwalkable = module_paths()
    found = [classify_submodule(path, twin(path)) for path in paths[1:]]
    found += [
        Submodule(name, "fails", "Accelerate's package did not import") for name in unwalkable
    ]
    return found


# ---------------------------------------------------------------- the report
STATUSES = ("imports", "needs", "listed", "fails")


def submodule_counts(submodules: list[Submodule]) -> str:
    """``N of M submodule paths import; K listed with a reason`` (and the optional ones)."""
    count = {status: sum(s.status == status for s in submodules) for status in STATUSES}
    return (
        f"{count['imports'] + count['needs']} of {len(submodules)} submodule paths import "
        f"({count['needs']} once their optional library is installed); "
        f"{count['listed']} listed with a reason; {count['fails']} fail"
    )


def render_submodules(submodules: list[Submodule]) -> list[str]:
    """The lines on module paths: the counts and the paths that do not import."""
    lines = ["", "**Submodule paths**", "", submodule_counts(submodules) + ".", ""]
    lines += ["| module path | status | note |", "| --- | --- | --- |"]
    listed: dict[str, list[str]] = {}
    for sub in submodules:
        if sub.status == "listed":
            listed.setdefault(sub.note, []).append(sub.path)
    for reason, paths in listed.items():
        more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
        lines.append(f"| `{min(paths, key=len)}`{more} | listed | {reason} |")
    lines += [
        f"| `{s.path}` | {s.status} | {s.note} |"
        for s in submodules
        if s.status in ("needs", "fails")
    ]
    return lines


def _namespaces(entries: list[Entry]) -> list[str]:
    """The namespaces of ``entries`` in report order: modules sorted, ``Accelerator`` last."""
    found = {entry.namespace for entry in entries}
    return sorted(found - {"Accelerator"}) + (["Accelerator"] if "Accelerator" in found else [])


def _summary(entries: list[Entry]) -> list[str]:
    lines = [
        "| module | names | same | differs | absent (reason recorded) | absent (no reason) "
        "| not the same object |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for namespace in _namespaces(entries):
        mine = [entry for entry in entries if entry.namespace == namespace]
        counts = [
            sum(e.status == "same" for e in mine),
            sum(e.status == "differs" for e in mine),
            sum(e.status == "absent" and bool(e.note) for e in mine),
            sum(e.status == "absent" and not e.note for e in mine),
            sum(e.status != "absent" and bool(e.reference) for e in mine),
        ]
        lines.append(f"| `{namespace}` | {len(mine)} | {' | '.join(map(str, counts))} |")
    return lines


MISSING_REEXPORT = (
    "(no reason recorded) accel has the same object under Accelerate's documented path "
    "(`accel.utils`, `accel`, ...): only the re-export at this module path is missing"
)


def _note(entry: Entry) -> str:
    if entry.note:
        return entry.note
    if entry.status == "absent" and entry.reference:
        return MISSING_REEXPORT
    return "(no reason recorded)"


def _by_note(entries: list[Entry]) -> dict[str, dict[str, list[str]]]:
    """The names grouped by note, then by namespace, in report order."""
    grouped: dict[str, dict[str, list[str]]] = {}
    for namespace in _namespaces(entries):
        for entry in entries:
            if entry.namespace == namespace:
                names = grouped.setdefault(_note(entry), {}).setdefault(namespace, [])
                names.append(entry.name)
    return grouped


def _name_lists(by_namespace: dict[str, list[str]]) -> str:
    return "; ".join(
        f"`{namespace}`: " + ", ".join(f"`{name}`" for name in names)
        for namespace, names in by_namespace.items()
    )


def render(version: str, entries: list[Entry], submodules: list[Submodule] | None = None) -> str:
    """The coverage page: per-module counts, the differing and absent names with their reasons.

    Differing and absent names are grouped by their note, so an object re-exported under several
    module paths takes one row. The module paths follow when ``submodules`` is given.
    """
    lines = [
        f"Compared with Accelerate {version}: every module path and the `Accelerator` class.",
        "",
        *_summary(entries),
    ]
    sections = (
        ("differs", "Differs (how)", "how"),
        ("absent", "Absent (why)", "why"),
    )
    for status, title, column in sections:
        chosen = [entry for entry in entries if entry.status == status]
        lines += ["", f"**{title}**", "", f"| {column} | names |", "| --- | --- |"]
        for note, by_namespace in _by_note(chosen).items():
            lines.append(f"| {note} | {_name_lists(by_namespace)} |")
    mismatched = [entry for entry in entries if entry.status != "absent" and entry.reference]
    if mismatched:
        lines += ["", "**Not the same object as in the documented namespace**", ""]
        lines += ["| accel name | should be the same object as |", "| --- | --- |"]
        lines += [f"| `{twin(e.namespace)}.{e.name}` | `{e.reference}` |" for e in mismatched]
    if submodules:
        lines += render_submodules(submodules)
    return "\n".join(lines)


def write_lists(entries: list[Entry], absent: str | None, signatures: str | None) -> None:
    """Write every absent name and every difference (one a line, tab-separated) to files."""
    if absent:
        pathlib.Path(absent).write_text(
            "".join(
                f"{e.namespace}\t{e.name}\t{_note(e)}"
                + (f" ({e.reference})" if e.reference else "")
                + "\n"
                for e in entries
                if e.status == "absent"
            )
        )
    if signatures:
        pathlib.Path(signatures).write_text(
            "".join(
                f"{e.namespace}\t{e.name}\t{'NOTES' if e.declared else 'undeclared'}\t{e.note}\n"
                for e in entries
                if e.status == "differs"
            )
            + "".join(
                f"{e.namespace}\t{e.name}\tnot the same object as {e.reference}\n"
                for e in entries
                if e.status != "absent" and e.reference
            )
        )


def _problems(entries: list[Entry], submodules: list[Submodule]) -> list[str]:
    """What ``--check`` fails on, one message per kind of gap."""
    messages = []
    unexplained = [e for e in entries if e.status == "absent" and not e.note]
    undeclared = [
        e
        for e in entries
        if e.status == "differs" and not e.declared and (e.namespace, e.name) not in NOTES
    ]
    mismatched = [e for e in entries if e.status != "absent" and e.reference]
    failing = [s for s in submodules if s.status == "fails"]
    if unexplained:
        listed = ", ".join(
            f"{e.namespace}.{e.name}" + (f" (accel has {e.reference})" if e.reference else "")
            for e in unexplained
        )
        messages.append(f"absent without a recorded reason: {listed}")
    if undeclared:
        listed = "; ".join(f"{e.namespace}.{e.name} ({e.note})" for e in undeclared)
        messages.append(
            f"signatures that differ without a NOTES entry (deliberately differs): {listed}"
        )
    if mismatched:
        listed = "; ".join(f"{twin(e.namespace)}.{e.name} (not {e.reference})" for e in mismatched)
        messages.append(f"re-exports that are not the same object as accel's: {listed}")
    if failing:
        listed = "; ".join(f"{s.path} ({s.note})" for s in failing)
        messages.append(
            f"module paths whose accel twin does not import, with no reason in "
            f"SUBMODULE_REASONS: {listed}"
        )
    return messages


def main(
    argv: list[str] | None = None,
    collector: Callable[[], tuple[str, list[Entry]]] = collect,
    submodule_collector: Callable[[], list[Submodule]] | None = None,
) -> int:
    """Print the coverage table; with ``--check``, fail on an unexplained gap.

    ``--check`` fails on absent names without a reason, on differences (a missing parameter,
    field or member) of names that have no :data:`NOTES` entry, on re-exports that are not the
    same object as accel's documented one, and on module paths of Accelerate whose accel twin
    does not import and that :data:`SUBMODULE_REASONS` does not list. ``submodule_collector``
    defaults to :func:`collect_submodules` with the default ``collector`` and to none with
    another one (tests pass their own entries).
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 on an unexplained gap")
    parser.add_argument("--absent", metavar="FILE", help="write every absent name to FILE")
    parser.add_argument(
        "--signatures", metavar="FILE", help="write every difference and identity mismatch to FILE"
    )
    args = parser.parse_args(argv)
    if submodule_collector is None:
        submodule_collector = collect_submodules if collector is collect else list
    try:
        version, entries = collector()
        submodules = submodule_collector()
    except ImportError as error:
        print(f"api_coverage needs Accelerate and accel installed: {error}", file=sys.stderr)
        return 2
    section = render(version, entries, submodules)
    print(section)
    write_lists(entries, args.absent, args.signatures)
    if submodules:
        print(submodule_counts(submodules), file=sys.stderr)
    problems = _problems(entries, submodules)
    for message in problems:
        print(message, file=sys.stderr)
    return 1 if problems and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
