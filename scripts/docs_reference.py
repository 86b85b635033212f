"""Generate the docs site's reference pages from the code, so that they cannot drift from it.

Run by the ``gen-files`` plugin of ``mkdocs.yml`` (``nox -s docs``); each page is written into
the build only, never into ``docs/``:

* ``reference/cli.md``: every ``accel`` subcommand and flag, read from the argparse parser;
* ``reference/config-keys.md``: every config-file key, read from the config dataclasses;
* ``reference/environment.md``: every variable of the launch contract
  (``accel_state.contract.VARIABLE_DESCRIPTIONS``) and the other ``ACCEL_*`` variables the
  packages read; a variable named in the sources without a meaning here fails the build;
* ``reference/api/<package>.md``: every name of each package's ``__all__``, rendered by
  mkdocstrings from the docstrings, with the Accelerate path it answers to;
* ``reference/errors.md``: every exception class and every message the packages raise
  (``scripts/error_index.py``);
* ``reference/torch-versions.md``: feature by torch release, from the feature gates
  (``scripts/torch_feature_table.py``);
* ``reference/accelerate-coverage.md``: ``scripts/api_coverage.py``'s comparison with Accelerate;
* ``benchmarks-results.md``: ``benchmarks/RESULTS.md``, the last complete benchmark run.

The Accelerate paths and the coverage page need Accelerate installed beside accel (``nox -s docs``
installs it without its dependencies, as ``nox -s api_coverage`` does).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import html
import importlib
import inspect
import os
import pathlib
import re
import sys
from collections.abc import Iterator
from typing import Any

import mkdocs_gen_files

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import api_coverage  # noqa: E402  (sibling scripts, found through the path above)
import torch_feature_table  # noqa: E402
from docs_members import inherited_public_names  # noqa: E402
from docs_rst_roles import plain_roles  # noqa: E402
from error_index import collect as collect_errors  # noqa: E402
from error_index import render as render_errors  # noqa: E402

#: Import name and distribution of each package, in dependency order: a name is rendered on the
#: first page that lists it (the package that defines it), and later pages link there.
PACKAGES = {
    "accel_state": "accel-state",
    "accel_ops": "accel-ops",
    "accel_data": "accel-data",
    "accel_ckpt": "accel-ckpt",
    "accel_launch": "accel-launch",
    "accel": "accel",
}
#: The API pages: each package, then ``accel.utils``, Accelerate's documented helper namespace.
API_MODULES = {**PACKAGES, "accel.utils": "accel"}
#: Variables the packages read outside the launch contract, with their meaning.
OTHER_VARIABLES = {
    "ACCEL_CONFIG_FILE": "config file `accel launch` reads when `--config_file` is not given",
    "ACCEL_LOG_LEVEL": "level of accel's loggers (`INFO`, `DEBUG`...; Accelerate's "
    "`ACCELERATE_LOG_LEVEL` is read too)",
    "ACCEL_SLOW_RANK_INTERVAL": "backward passes per window of the slow-rank report, whose "
    "per-phase step times the ranks exchange (default 10; `0` turns the report off)",
    "ACCEL_SLOW_RANK_MIN_MS": "how many milliseconds per step a rank must lose in one phase to "
    "be named slow (default 10)",
    "ACCEL_SLOW_RANK_THRESHOLD": "and what fraction of the median step (default 0.1)",
}
#: Variables that only accel's own test helpers read; not documented for users.
TEST_VARIABLE = re.compile(r"ACCEL_(TEST|CKPT_TEST)_\w+")


def breakable_code(path: str) -> str:
    """A dotted path as inline code that a narrow table cell wraps after its dots only."""
    return "<code>" + ".<wbr>".join(html.escape(part) for part in path.split(".")) + "</code>"


def cell(text: str) -> str:
    """``text`` made safe for one markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


# --- command line -------------------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of ``parser`` by name (aliases left out)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub not in found.values():
                    found[name] = sub
    return found


def flag_value(action: argparse.Action) -> str:
    """What a flag takes: its choices, its metavar, or nothing for a switch."""
    if action.nargs == 0:
        return ""
    if action.choices:
        return " \\| ".join(f"`{choice}`" for choice in action.choices)
    metavar = action.metavar or action.dest.upper()
    return f"`{metavar if isinstance(metavar, str) else ' '.join(metavar)}`"


def flag_default(action: argparse.Action) -> str:
    """The default a reader needs to know: nothing for unset values and switches."""
    if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
        return ""
    return f"`{action.default}`"


def parser_section(path: str, parser: argparse.ArgumentParser, level: int) -> Iterator[str]:
    """Markdown for one (sub)command: its description, then a table of flags per argument group."""
    yield f"{'#' * level} `{path}`"
    yield ""
    if parser.description:
        yield parser.description.strip()
        yield ""
    yield f"```text\n{parser.format_usage().strip()}\n```"
    yield ""
    for group in parser._action_groups:
        rows = []
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS or isinstance(
                action, (argparse._SubParsersAction, argparse._HelpAction)
            ):
                continue
            names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.dest}`"
            help_text = action.help % vars(action) if action.help else ""
            rows.append(
                f"| {names} | {flag_value(action)} | {flag_default(action)} | {cell(help_text)} |"
            )
        if rows:
            yield f"**{group.title}**" if group.title else ""
            yield ""
            yield "| flag | value | default | meaning |"
            yield "| --- | --- | --- | --- |"
            yield from rows
            yield ""
    for name, sub in subcommands(parser).items():
        yield from parser_section(f"{path} {name}", sub, min(level + 1, 4))


def cli_page() -> str:
    """Every ``accel`` subcommand with every flag, straight from the parser."""
    from accel_launch.cli import build_parser

    lines = [
        "# Command line",
        "",
        "Generated from `accel`'s argparse parser when the site is built: every subcommand and "
        "every flag, with its default and help. Each multi-word flag is also accepted with "
        "hyphens (`--num-processes`), as Accelerate spells them; `accel-launch` is "
        "`accel launch`. The guide is [The launcher](../launcher.md).",
        "",
    ]
    parser = build_parser()
    lines += parser_section("accel", parser, 2)
    return "\n".join(lines) + "\n"


# --- config file --------------------------------------------------------------------------------


def config_rows(section: type, prefix: str) -> Iterator[str]:
    """One table row per key of a config dataclass; nested sections follow as their own keys."""
    for field in dataclasses.fields(section):
        nested = field.metadata.get("section")
        key = f"{prefix}{field.name}"
        if nested is not None:
            yield f"| `{key}` | section | {cell(field.metadata.get('doc', ''))} |"
            yield from config_rows(nested, f"{key}.")
            continue
        doc = field.metadata.get("doc")
        if not doc:
            raise RuntimeError(f"config key {key} has no 'doc' in its field metadata")
        kind = str(field.type).replace(" | None", "")
        yield f"| `{key}` | `{kind}` | {cell(doc)} |"


def config_page() -> str:
    """Every key of the config file, from the dataclasses that parse it."""
    from accel_launch.config.schema import IGNORED_KEYS, AccelConfig

    lines = [
        "# Config file keys",
        "",
        "Generated from the dataclasses that parse the file (`accel_launch.config.schema`). "
        "Keys and values are Accelerate's, so a file written by `accelerate config` loads "
        "unchanged; every key is also a flag of `accel launch` (the nested keys without their "
        "section). How the file is found and merged with flags: [Config file](config-file.md).",
        "",
        "| key | type | meaning |",
        "| --- | --- | --- |",
        *config_rows(AccelConfig, ""),
        "",
        "Read and ignored (Accelerate writes them for setups accel does not drive): "
        + ", ".join(f"`{key}`" for key in sorted(IGNORED_KEYS))
        + ".",
    ]
    return "\n".join(lines) + "\n"


# --- environment --------------------------------------------------------------------------------


def variables_in_sources() -> set[str]:
    """Every ``ACCEL_*`` variable name written as a string in the packages' sources."""
    found: set[str] = set()
    for source in (ROOT / "packages").glob("*/src/**/*.py"):
        found.update(re.findall(r"[\"'](ACCEL_[A-Z0-9_]+)[\"']", source.read_text()))
    return {name for name in found if not TEST_VARIABLE.fullmatch(name)}


def environment_page() -> str:
    """The launcher-to-worker contract and every other variable accel reads."""
    from accel_state import contract

    described = {**contract.VARIABLE_DESCRIPTIONS, **OTHER_VARIABLES}
    missing = sorted(variables_in_sources() - set(described))
    unlisted = sorted(set(contract.ALL_VARIABLES) - set(contract.VARIABLE_DESCRIPTIONS))
    if missing or unlisted:
        raise RuntimeError(
            "variables without a meaning: "
            + ", ".join(missing + unlisted)
            + " (add them to accel_state.contract.VARIABLE_DESCRIPTIONS, or to "
            "OTHER_VARIABLES in scripts/docs_reference.py when they are not the launcher's)"
        )
    lines = [
        "# Environment variables",
        "",
        "Generated from the launch contract (`accel_state.contract`), the only module that names "
        "the variables `accel launch` writes for its workers. `accel launch`, `torchrun`, `srun`, "
        "`mpirun` and Ray set PyTorch's own (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, "
        "`MASTER_PORT`...); the `Accelerator` reads whichever launcher's it finds.",
        "",
        "## Launcher to workers",
        "",
        "| variable | meaning |",
        "| --- | --- |",
        *(f"| `{name}` | {cell(text)} |" for name, text in contract.VARIABLE_DESCRIPTIONS.items()),
        "",
        "Every worker also gets Accelerate's own variables for the same settings, with the values "
        "`accelerate launch` gives them (`ACCELERATE_MIXED_PRECISION`, `ACCELERATE_USE_FSDP` with "
        "`FSDP_*`, `ACCELERATE_USE_DEEPSPEED` with `ACCELERATE_DEEPSPEED_*`...): transformers "
        "reads those. Set by hand without accel's own, they are read too; accel's `ACCEL_*` "
        "spelling wins where both are set.",
        "",
        f"A job stopped by SIGTERM (preemption) exits with `{contract.REQUEUE_EXIT_CODE}` "
        "(`EX_TEMPFAIL`), which schedulers can be told to requeue.",
        "",
        "## Other settings",
        "",
        "| variable | meaning |",
        "| --- | --- |",
        *(f"| `{name}` | {cell(text)} |" for name, text in OTHER_VARIABLES.items()),
    ]
    return "\n".join(lines) + "\n"


# --- API ----------------------------------------------------------------------------------------


def owner(obj: Any) -> str | None:
    """The import name of the package of ours that defines ``obj`` at a path mkdocstrings reads.

    None for constants, for objects of other libraries and for functions made by a factory
    (their ``__qualname__`` holds ``<locals>``).
    """
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str) or not (inspect.isclass(obj) or inspect.isroutine(obj)):
        return None
    if "<locals>" in obj.__qualname__:
        return None
    top = module.split(".")[0]
    return top if top in PACKAGES else None


def canonical(obj: Any) -> str:
    """The dotted path mkdocstrings renders ``obj`` under: where it is defined."""
    return f"{obj.__module__}.{obj.__qualname__}"


@dataclasses.dataclass
class AccelerateIndex:
    """Accelerate's public paths by the accel object (or constant) each answers to."""

    by_object: dict[int, list[str]]
    by_constant: dict[tuple[str, str], list[str]]

    def paths(self, name: str, obj: Any) -> list[str]:
        """Accelerate's paths for ``obj``, documented namespaces first, then the shortest."""
        if isinstance(obj, api_coverage.IMMUTABLE):
            found = self.by_constant.get((name, repr(obj)), [])
        else:
            found = self.by_object.get(id(obj), [])

        def rank(path: str) -> tuple[int, int, str]:
            module = path.rsplit(".", 1)[0]
            return (0 if module in api_coverage.DOCUMENTED else 1, len(path), path)

        return sorted(set(found), key=rank)


def accelerate_index(entries: list[Any]) -> AccelerateIndex:
    """Map each accel object that stands for an Accelerate name to that name's path."""
    index = AccelerateIndex({}, {})
    for entry in entries:
        if entry.status == "absent" or entry.namespace == "Accelerator":
            continue
        module = importlib.import_module(api_coverage.twin(entry.namespace))
        found, ours = api_coverage._lookup(module, entry.name)
        if not found or inspect.ismodule(ours):
            continue
        path = f"{entry.namespace}.{entry.name}"
        if isinstance(ours, api_coverage.IMMUTABLE):
            index.by_constant.setdefault((entry.name, repr(ours)), []).append(path)
        else:
            index.by_object.setdefault(id(ours), []).append(path)
    return index


def kind_of(obj: Any) -> str:
    """A word for what ``obj`` is, as the API tables show it."""
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exception"
        if issubclass(obj, enum.Enum):
            return "enum"
        return "class"
    if inspect.isroutine(obj):
        return "function"
    return "constant"


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to fit a table cell."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def summary(obj: Any) -> str:
    """The first sentence of ``obj``'s docstring, or nothing."""
    first = plain_roles(inspect.getdoc(obj) or "").split("\n\n")[0]
    return first.split(". ")[0].rstrip(".") + "." if first else ""


def api_row(
    name: str, obj: Any, placed: dict[str, str], index: AccelerateIndex
) -> tuple[str, str | None]:
    """One table row for ``name``, and the path to render on this page (None: rendered elsewhere).

    The name links to where it is rendered: below, or on the earlier page that ``placed`` says
    rendered it. Constants show their value; factory-made functions their summary.
    """
    paths = index.paths(name, obj)
    accelerate = breakable_code(paths[0]) if paths else "—"
    if len(paths) > 1:
        accelerate += f" (+{len(paths) - 1})"
    kind = kind_of(obj)
    home = owner(obj)
    if home is None:
        text = f"`{short_repr(obj)}`" if kind == "constant" else cell(summary(obj))
        return f"| `{name}` | {kind} | {text} | {accelerate} |", None
    target = canonical(obj)
    elsewhere = placed.get(target)
    text = cell(summary(obj)) if elsewhere is None else f"in `{elsewhere}`: {cell(summary(obj))}"
    row = f"| [`{name}`][{target}] | {kind} | {text} | {accelerate} |"
    return row, target if elsewhere is None else None


def api_page(package: str, placed: dict[str, str], index: AccelerateIndex) -> str:
    """One package's public names: a table with their Accelerate paths, then each rendered.

    Adds what it renders to ``placed`` (path -> this package), for the pages that follow.
    """
    module = importlib.import_module(package)
    names = sorted((name for name in module.__all__ if name != "__version__"), key=str.lower)
    rows, rendered = [], {}
    for name in names:
        obj = getattr(module, name)
        row, target = api_row(name, obj, placed, index)
        rows.append(row)
        if target is not None and target not in rendered:
            rendered[target] = obj
            placed[target] = package
    lines = [
        f"# `{package}`",
        "",
        f"The public names of `{package}` (the `{API_MODULES[package]}` distribution): its "
        "`__all__`, generated from the docstrings when the site is built. *Accelerate* is the "
        "path the same object answers to in Hugging Face Accelerate 1.15, where there is one "
        "(+N: under N more paths). A name that another of accel's packages defines links to "
        "that package's page.",
        "",
        "| name | kind | summary | Accelerate |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
    ]
    for target, obj in rendered.items():
        lines += [*render_directive(target, obj), ""]
    return "\n".join(lines)


def render_directive(target: str, obj: Any) -> list[str]:
    """The mkdocstrings directive rendering ``target``, with what a class inherits from our bases.

    mkdocstrings renders a class's own members; the public ones it inherits from accel's classes
    (the ``Accelerator``'s mixins) are named so that they are rendered too, with their docstrings.
    """
    inherited = inherited_public_names(obj) if inspect.isclass(obj) else []
    if not inherited:
        return [f"::: {target}"]
    return [f"::: {target}", "    options:", f"      inherited_members: {inherited!r}"]


# --- pages --------------------------------------------------------------------------------------


def write(path: str, text: str) -> None:
    """Add ``text`` to the build as ``path`` (inside ``docs/``, not written to the repository)."""
    with mkdocs_gen_files.open(path, "w") as handle:
        handle.write(text)


def main() -> None:
    """Write every generated page into the build."""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    write("reference/cli.md", cli_page())
    write("reference/config-keys.md", config_page())
    write("reference/environment.md", environment_page())
    write("reference/errors.md", render_errors(collect_errors()))
    write("reference/torch-versions.md", torch_feature_table.render())
    version, entries = api_coverage.collect()
    index = accelerate_index(entries)
    placed: dict[str, str] = {}
    for package in API_MODULES:
        write(f"reference/api/{package}.md", api_page(package, placed, index))
    coverage = api_coverage.render(version, entries, api_coverage.collect_submodules())
    write(
        "reference/accelerate-coverage.md",
        "# Accelerate API coverage\n\n"
        "Generated by `scripts/api_coverage.py` when the site is built: every module path of "
        "Accelerate and the `Accelerator` class, name by name, against accel. `nox -s "
        "api_coverage` fails on a gap without a recorded reason.\n\n" + coverage + "\n",
    )
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    write("benchmarks-results.md", re.sub(r"^# .*\n", "# Benchmark results\n", results, count=1))


main()
