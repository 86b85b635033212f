"""Check a built docs site against the code: what the reference pages must hold, page by page.

``nox -s docs`` runs it after ``mkdocs build --strict`` (which already fails on a broken link or
reference). It checks what a strict build cannot see: that every flag of every ``accel``
subcommand, every config key, every variable of the launch contract and every public name of
each package appears on its generated page, that every page of the nav was built, and that the
search index covers every page. Prints the page count; exits 1 with a list of what is missing.

Usage: ``python scripts/check_docs_site.py SITE_DIR``
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import importlib
import inspect
import json
import pathlib
import re
import sys
from collections.abc import Iterator
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from docs_members import OUR_PACKAGES, is_class, methods_and_properties  # noqa: E402  (a sibling script)

API_MODULES = (
    "accel",
    "accel.utils",
    "accel_state",
    "accel_ops",
    "accel_data",
    "accel_ckpt",
    "accel_launch",
)


def page_text(site: pathlib.Path, page: str) -> str:
    """The unescaped HTML of ``page`` (a docs path such as ``reference/cli.md``)."""
    folder = page.removesuffix(".md").removesuffix("index")  # a section's index.md is its folder
    built = site / folder / "index.html"
    return html.unescape(built.read_text()) if built.is_file() else ""


def nav_pages(entries: list[Any]) -> Iterator[str]:
    """Every page path of ``mkdocs.yml``'s nav, nested sections included."""
    for entry in entries:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict):
            for value in entry.values():
                yield from nav_pages(value) if isinstance(value, list) else iter([value])


def subcommand_flags() -> dict[str, list[str]]:
    """Each ``accel`` (sub)command's option strings, help and suppressed ones left out."""
    from accel_launch.cli import build_parser

    found: dict[str, list[str]] = {}

    def walk(path: str, parser: argparse.ArgumentParser) -> None:
        flags = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(f"{path} {name}", sub)
            elif action.help != argparse.SUPPRESS and action.option_strings:
                flags += [flag for flag in action.option_strings if flag not in ("-h", "--help")]
        found[path] = flags

    walk("accel", build_parser())
    return found


def config_keys(section: type, prefix: str = "") -> Iterator[str]:
    """Every key of the config file, nested ones as ``section.key``."""
    for field in dataclasses.fields(section):
        nested = field.metadata.get("section")
        yield f"{prefix}{field.name}"
        if nested is not None:
            yield from config_keys(nested, f"{prefix}{field.name}.")


def problems(site: pathlib.Path) -> tuple[int, list[str]]:
    """The number of built pages and what the site lacks."""
    from accel_launch.config.schema import AccelConfig
    from accel_state import contract

    missing: list[str] = []
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = list(nav_pages(nav))
    missing += [f"nav page {page} was not built" for page in pages if not page_text(site, page)]

    cli = page_text(site, "reference/cli.md")
    for command, flags in subcommand_flags().items():
        if f"<code>{command}</code>" not in cli:
            missing.append(f"reference/cli.md lacks the command {command!r}")
        missing += [
            f"reference/cli.md lacks {command} {flag}"
            for flag in flags
            if f"<code>{flag}</code>" not in cli
        ]
    keys = page_text(site, "reference/config-keys.md")
    missing += [
        f"reference/config-keys.md lacks {key}"
        for key in config_keys(AccelConfig)
        if f"<code>{key}</code>" not in keys
    ]
    environment = page_text(site, "reference/environment.md")
    missing += [
        f"reference/environment.md lacks {name}"
        for name in contract.VARIABLE_DESCRIPTIONS
        if f"<code>{name}</code>" not in environment
    ]
    for package in API_MODULES:
        text = page_text(site, f"reference/api/{package}.md")
        names = [n for n in importlib.import_module(package).__all__ if n != "__version__"]
        missing += [
            f"reference/api/{package}.md lacks {name}"
            for name in names
            if f"<code>{name}</code>" not in text
        ]
    missing += member_problems(site)
    missing += error_index_problems(site)
    index = json.loads((site / "search" / "search_index.json").read_text())
    searched = {re.sub(r"#.*", "", doc["location"]) for doc in index["docs"]}
    built = sorted(site.rglob("index.html"))
    for path in built:
        location = "" if path.parent == site else f"{path.parent.relative_to(site).as_posix()}/"
        if location not in searched:
            missing.append(f"the search index lacks the page {location or 'index'}")
    return len(built), missing


def public_classes() -> dict[str, type]:
    """Every public class of accel's API pages by the dotted path mkdocstrings renders it under."""
    found: dict[str, type] = {}
    for module_name in API_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if is_class(obj) and "<locals>" not in obj.__qualname__:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def member_problems(site: pathlib.Path) -> list[str]:
    """Public methods and properties (inherited ones included) missing from the API pages.

    Each must be rendered under its class, with a docstring. Prints how many are.
    """
    pages = "".join(path.read_text() for path in (site / "reference" / "api").rglob("*.html"))
    problems, total = [], 0
    for path, cls in sorted(public_classes().items()):
        for name in methods_and_properties(cls):
            total += 1
            if f'id="{path}.{name}"' not in pages:
                problems.append(f"the API reference does not render {path}.{name}")
            elif not inspect.getdoc(getattr(cls, name, None)):
                problems.append(f"{path}.{name} has no docstring")
    print(f"docs: {total - len(problems)} of {total} public methods and properties documented")
    return problems


def error_index_problems(site: pathlib.Path) -> list[str]:
    """Exception classes of the packages' ``errors`` modules missing from the error index."""
    text = page_text(site, "reference/errors.md")
    problems = []
    for package in OUR_PACKAGES:
        errors = importlib.import_module(f"{package}.errors")
        for name, obj in vars(errors).items():
            defined_here = inspect.isclass(obj) and obj.__module__ == errors.__name__
            an_error = defined_here and name == obj.__name__ and issubclass(obj, Exception)
            if (
                an_error
                and not issubclass(obj, Warning)
                and f"{errors.__name__}.{name}" not in text
            ):
                problems.append(f"reference/errors.md lacks {errors.__name__}.{name}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Check the site at the given folder; print the page count and every problem."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("site", type=pathlib.Path, help="the folder mkdocs built")
    args = parser.parse_args(argv)
    count, found = problems(args.site)
    for message in found:
        print(f"docs: {message}", file=sys.stderr)
    print(f"docs: {count} pages checked, {len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
