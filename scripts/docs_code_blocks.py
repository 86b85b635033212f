"""Find every fenced code block of the docs and READMEs, check its mark and syntax, run programs.

Every python block carries a mark on the line directly above its opening fence (an HTML comment,
invisible on the site):

* ``<!-- check: run -->``: a complete program, run with ``python`` in an empty folder;
* ``<!-- check: launch N -->``: a complete training script, run with
  ``accel launch --cpu --num_processes N``;
* ``<!-- check: fragment -->``: part of a program, only compiled; its fence carries a title that
  starts with "Fragment" and tells the reader what the rest of the program must supply.

``run`` and ``launch`` take ``expect="REGEX"``: the program's output must match it. Blocks in
other languages are syntax-checked (``bash -n``, YAML, JSON); text blocks are output.

Usage::

    python scripts/docs_code_blocks.py                 # every block: its kind and problems
    python scripts/docs_code_blocks.py --run [PAGE...] # also run the programs (of PAGE only)

``tests-integration/docs/test_docs_code_blocks.py`` runs the same checks in CI.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

import yaml

from accel_state.testing.environ import without_launcher_variables

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Each program's hard limit, for hangs (a docs program finishes in seconds).
RUN_TIMEOUT_SECONDS = 300
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>.*)$")
MARK = re.compile(
    r"^\s*<!--\s*check:\s*(?P<kind>run|launch|fragment)(?:\s+(?P<processes>\d+))?"
    r'(?:\s+expect="(?P<expect>[^"]*)")?\s*-->\s*$'
)
TITLE = re.compile(r'title="(?P<title>[^"]*)"')
LANGUAGES = {
    "python": "python",
    "py": "python",
    "bash": "bash",
    "sh": "bash",
    "shell": "bash",
    "yaml": "yaml",
    "yml": "yaml",
    "json": "json",
}
RUNNABLE = ("run", "launch")


@dataclasses.dataclass(frozen=True)
class CodeBlock:
    """One fenced block: where it is, its language, its mark and its text."""

    path: pathlib.Path
    line: int
    language: str
    kind: str
    processes: int
    expect: str | None
    title: str
    text: str

    @property
    def where(self) -> str:
        """``file:line`` of the opening fence, relative to the repository."""
        try:
            shown = self.path.resolve().relative_to(ROOT)
        except ValueError:
            shown = self.path
        return f"{shown.as_posix()}:{self.line}"

    @property
    def runnable(self) -> bool:
        """Whether CI runs this block as a program."""
        return self.kind in RUNNABLE


def documentation_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """The markdown files whose blocks are checked: ``docs/`` and every README."""
    files = sorted((root / "docs").rglob("*.md"))
    files += [root / "README.md", *sorted((root / "packages").glob("*/README.md"))]
    return [path for path in files if path.is_file()]


def kind_of_unmarked(language: str) -> str:
    """What an unmarked block is: output text, or code that is only syntax-checked."""
    return "syntax" if language in LANGUAGES.values() else "text"


def parse_blocks(path: pathlib.Path) -> Iterator[CodeBlock]:
    """Every fenced block of the markdown file ``path``, in order."""
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        info = opening["info"].strip()
        word = info.split(maxsplit=1)[0].strip("{}.").lower() if info else ""
        language = LANGUAGES.get(word, word or "text")
        title_match = TITLE.search(info)
        body: list[str] = []
        index += 1
        while index < len(lines):
            closing = FENCE.match(lines[index])
            if closing and closing["fence"].startswith(fence) and not closing["info"].strip():
                break
            body.append(lines[index].removeprefix(indent))
            index += 1
        start = index - len(body)  # the fence's line number (1-based)
        mark = MARK.match(lines[start - 2]) if start >= 2 else None
        kind = mark["kind"] if mark else kind_of_unmarked(language)
        processes = int(mark["processes"]) if mark and mark["processes"] else 1
        yield CodeBlock(
            path=path,
            line=start,
            language=language,
            kind=kind,
            processes=processes,
            expect=mark["expect"] if mark else None,
            title=title_match["title"] if title_match else "",
            text="\n".join(body) + "\n",
        )
        index += 1


def all_blocks(files: list[pathlib.Path] | None = None) -> list[CodeBlock]:
    """The blocks of ``files`` (default: every documentation file)."""
    return [block for path in files or documentation_files() for block in parse_blocks(path)]


def mark_problems(block: CodeBlock) -> list[str]:
    """What is wrong with the block's mark (an unmarked python block, a fragment without title)."""
    problems = []
    if block.language == "python" and block.kind not in (*RUNNABLE, "fragment"):
        problems.append(
            "a python block needs a mark above its fence: <!-- check: run -->, "
            "<!-- check: launch N --> or <!-- check: fragment -->"
        )
    if block.runnable and block.language != "python":
        problems.append(f"only python blocks can be {block.kind}; this one is {block.language}")
    if block.kind == "launch" and not 1 <= block.processes <= 4:
        problems.append(f"launch {block.processes}: use 1 to 4 processes (CI has 2 cores)")
    if block.runnable and not block.expect:
        problems.append(f'a {block.kind} block needs expect="REGEX" naming what it shows')
    if block.expect:
        try:
            re.compile(block.expect)
        except re.error as error:
            problems.append(f"expect={block.expect!r} is not a regular expression: {error}")
    fragment = block.kind == "fragment" and block.language == "python"
    if fragment and not block.title.lower().startswith("fragment"):
        problems.append(
            "a python fragment needs a fence title saying what it lacks, e.g. ```python "
            'title="Fragment: model and loader come from your script"'
        )
    return problems


def syntax_problems(block: CodeBlock) -> list[str]:
    """Whether the block's text parses in its language."""
    try:
        if block.language == "python":
            ast.parse(block.text, filename=block.where)
        elif block.language == "bash":
            checked = subprocess.run(
                ["bash", "-n"], input=block.text, capture_output=True, text=True, check=False
            )
            if checked.returncode:
                return [f"bash -n: {checked.stderr.strip()}"]
        elif block.language == "yaml":
            list(yaml.safe_load_all(block.text))
        elif block.language == "json":
            json.loads(block.text)
    except (SyntaxError, yaml.YAMLError, ValueError) as error:
        return [f"{block.language} does not parse: {error}"]
    return []


def problems_of(block: CodeBlock) -> list[str]:
    """Every problem of the block found without running it."""
    return mark_problems(block) + syntax_problems(block)


def accel_script() -> str:
    """The ``accel`` console script installed beside this interpreter."""
    script = pathlib.Path(sys.executable).with_name("accel")
    if not script.exists():
        raise FileNotFoundError(f"no accel console script beside {sys.executable}")
    return str(script)


def program_environment() -> dict[str, str]:
    """The environment a docs program runs in: CPU only, one thread, no launcher variables.

    Neither accel's nor Accelerate's settings variables pass either: the program runs as a
    reader's would, on its own settings.
    """
    inherited = {
        name: value
        for name, value in without_launcher_variables(os.environ).items()
        if not name.startswith("ACCELERATE_")
    }
    return {
        **inherited,
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What running one block gave: its problems (none when it passed), output and seconds."""

    problems: list[str]
    output: str
    seconds: float


def run_block(
    block: CodeBlock,
    timeout: float = RUN_TIMEOUT_SECONDS,
    arguments: Sequence[str] = (),
    folder: pathlib.Path | None = None,
    expect: str | None = None,
) -> RunResult:
    """Run a ``run``/``launch`` block and check its exit code and output.

    Args:
        block: The block to run.
        timeout: Hard limit in seconds, for hangs.
        arguments: Command-line arguments for the program.
        folder: Where to run it (default: a new empty folder); a second run in the same folder
            sees what the first one wrote, as a reader's second launch would.
        expect: The regex its output must match (default: the block's ``expect``).
    """
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="accel-docs-") as empty:
            return run_block(block, timeout, arguments, pathlib.Path(empty), expect)
    expect = block.expect if expect is None else expect
    name = block.title if block.title.endswith(".py") and "/" not in block.title else "snippet.py"
    program = folder / name
    program.write_text(block.text)
    if block.kind == "launch":
        command = [accel_script(), "launch", "--cpu", "--num_processes", str(block.processes)]
    else:
        command = [sys.executable]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [*command, name, *arguments],
            cwd=folder,
            env=program_environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or "") + (expired.stderr or "")
        output = output if isinstance(output, str) else output.decode(errors="replace")
        return RunResult([f"still running after {timeout:.0f} s"], output, float(timeout))
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    problems = []
    if done.returncode:
        problems.append(f"exited with {done.returncode}")
    problems += expect_problems(expect, output)
    return RunResult(problems, output, seconds)


def expect_problems(expect: str | None, output: str) -> list[str]:
    """What is wrong with ``output`` against the ``expect`` regex (nothing without one)."""
    if expect and not re.search(expect, output, re.MULTILINE):
        return [f"the output does not match expect={expect!r}"]
    return []


def counts(blocks: list[CodeBlock]) -> dict[str, int]:
    """How many blocks of each kind there are."""
    found: dict[str, int] = {}
    for block in blocks:
        found[block.kind] = found.get(block.kind, 0) + 1
    return dict(sorted(found.items()))


def main(argv: list[str] | None = None) -> int:
    """Check every block (and run programs with --run); exit 1 on any problem."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("pages", nargs="*", type=pathlib.Path, help="markdown files (default: all)")
    parser.add_argument("--run", action="store_true", help="also run run/launch blocks")
    args = parser.parse_args(argv)
    blocks = all_blocks([page.resolve() for page in args.pages] or None)
    failed = 0
    for block in blocks:
        problems = problems_of(block)
        output = ""
        if args.run and block.runnable and not problems:
            result = run_block(block)
            problems, output = result.problems, result.output
            print(f"{block.where}: {block.kind} ran in {result.seconds:.1f} s")
        for problem in problems:
            print(f"{block.where}: {problem}", file=sys.stderr)
        if problems and output:
            print("\n".join(output.splitlines()[-30:]), file=sys.stderr)
        failed += bool(problems)
    summary = ", ".join(f"{count} {kind}" for kind, count in counts(blocks).items())
    print(f"docs code blocks: {len(blocks)} ({summary}); {failed} with problems")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
