"""Every code block of the docs and READMEs: marked, parsing, and each program run as written.

``scripts/docs_code_blocks.py`` finds and checks the blocks; these tests run it over the
repository (one test per program, under ``accel launch`` where the block says so) and check the
checker itself on small pages written here.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from repo_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


checker = load_script("docs_code_blocks")
BLOCKS = checker.all_blocks()
START_PAGE = ROOT / "docs" / "start.md"


def first_python_block(page: Path):
    """The first python block of ``page`` (None without one)."""
    return next((block for block in checker.parse_blocks(page) if block.language == "python"), None)


def program_key(block) -> tuple[str, str, int, str]:
    """What makes two blocks the same program: text, how it is run, and its file name."""
    return (block.text, block.kind, block.processes, block.title)


START_PROGRAM = first_python_block(START_PAGE)
# Blocks that are the same program (a README repeating a docs page) run once, and each block's
# expect is checked against that run. The start page's program runs (twice) in
# test_the_start_page_program_saves_and_a_second_launch_resumes.
SAME_PROGRAM: dict[tuple[str, str, int, str], list] = {}
for _block in BLOCKS:
    if _block.runnable:
        SAME_PROGRAM.setdefault(program_key(_block), []).append(_block)
START_BLOCKS = SAME_PROGRAM.pop(program_key(START_PROGRAM), [])
PROGRAMS = list(SAME_PROGRAM.values())


def expect_problems(blocks: list, output: str) -> list[str]:
    """Each block whose expect regex the output does not match."""
    return [
        f"{block.where}: {problem}"
        for block in blocks
        for problem in checker.expect_problems(block.expect, output)
    ]


@pytest.fixture(scope="module")
def program_runs() -> dict[tuple[str, str, int, str], object]:
    """Every distinct docs program, run two at a time, each in an empty folder.

    Two at a time: beside a session that mostly waits (slurm, ft, ray) one of CI's two cores is
    idle. Each program keeps its own hard timeout.
    """
    with ThreadPoolExecutor(max_workers=2) as pool:
        # expect="": the blocks' own expect regexes are checked by each test, per block.
        futures = {
            key: pool.submit(checker.run_block, blocks[0], expect="")
            for key, blocks in SAME_PROGRAM.items()
        }
        return {key: future.result() for key, future in futures.items()}


def test_every_block_is_marked_and_parses() -> None:
    found = [
        f"{block.where}: {problem}" for block in BLOCKS for problem in checker.problems_of(block)
    ]
    assert not found, "\n".join(found)
    counted = checker.counts(BLOCKS)
    print(f"docs code blocks: {len(BLOCKS)} {counted}")
    assert len(PROGRAMS) >= 10, f"only {len(PROGRAMS)} docs programs are run by CI"


@pytest.mark.parametrize("page", ["docs/start.md", "README.md"])
def test_the_first_python_block_is_a_complete_program(page: str) -> None:
    first = first_python_block(ROOT / page)
    assert first is not None, f"{page} has no python block"
    assert first.kind == "launch", f"{first.where} is {first.kind}: the first loop must run"
    assert "save_state(" in first.text and "load_state(" in first.text, first.where


def test_the_start_page_program_saves_and_a_second_launch_resumes(tmp_path: Path) -> None:
    # As the page tells a reader: `accel launch ... train.py`, then `... train.py 4`.
    first = checker.run_block(START_PROGRAM, folder=tmp_path, expect="")
    problems = first.problems + expect_problems(START_BLOCKS, first.output)  # the README's too
    assert not problems, f"{'; '.join(problems)}\n{first.output[-3000:]}"
    assert (tmp_path / "runs" / "checkpoints" / "checkpoint_1").is_dir()
    resumed = checker.run_block(
        START_PROGRAM,
        folder=tmp_path,
        arguments=["4"],
        expect=r"resumed from runs/checkpoints/checkpoint_1 at epoch 2\n(.|\n)*epoch 3: accuracy",
    )
    assert not resumed.problems, f"{'; '.join(resumed.problems)}\n{resumed.output[-3000:]}"
    assert "resumed from runs/checkpoints/checkpoint_1 at epoch 2" in START_PAGE.read_text()


@pytest.mark.parametrize(
    "blocks", PROGRAMS, ids=[" = ".join(block.where for block in blocks) for blocks in PROGRAMS]
)
def test_docs_program_runs_as_written(blocks: list, program_runs: dict) -> None:
    result = program_runs[program_key(blocks[0])]
    problems = result.problems + expect_problems(blocks, result.output)
    tail = "\n".join(result.output.splitlines()[-40:])
    assert not problems, f"{blocks[0].where}: {'; '.join(problems)}\n{tail}"


# --- the checker itself ----------------------------------------------------------------------


def blocks_of(tmp_path: Path, markdown: str) -> list:
    page = tmp_path / "page.md"
    page.write_text(markdown)
    return list(checker.parse_blocks(page))


def test_an_unmarked_python_block_and_an_untitled_fragment_are_problems(tmp_path: Path) -> None:
    unmarked, untitled, titled = blocks_of(
        tmp_path,
        "```python\nx = 1\n```\n\n<!-- check: fragment -->\n```python\nx = 1\n```\n\n"
        '<!-- check: fragment -->\n```python title="Fragment: x comes from above"\ny = x\n```\n',
    )
    assert "needs a mark" in " ".join(checker.problems_of(unmarked))
    assert "fence title" in " ".join(checker.problems_of(untitled))
    assert checker.problems_of(titled) == []
    assert titled.title == "Fragment: x comes from above"


def test_blocks_that_do_not_parse_are_problems(tmp_path: Path) -> None:
    python, bash, yaml_block, fine = blocks_of(
        tmp_path,
        '<!-- check: fragment -->\n```python title="Fragment"\ndef f(:\n```\n'
        "```bash\nif then fi (\n```\n```yaml\nkey: [unclosed\n```\n```bash\necho ok\n```\n",
    )
    assert "does not parse" in " ".join(checker.problems_of(python))
    assert "bash -n" in " ".join(checker.problems_of(bash))
    assert "does not parse" in " ".join(checker.problems_of(yaml_block))
    assert checker.problems_of(fine) == []


def test_an_indented_block_in_a_list_is_read_without_its_indent(tmp_path: Path) -> None:
    (block,) = blocks_of(
        tmp_path,
        '1. Run it:\n\n    <!-- check: run expect="^42$" -->\n    ```python\n    print(6 * 7)\n'
        "    ```\n",
    )
    assert (block.kind, block.expect, block.text) == ("run", "^42$", "print(6 * 7)\n")
    assert checker.problems_of(block) == []


def test_a_program_must_exit_zero_and_print_what_it_expects(tmp_path: Path) -> None:
    passing, wrong_output, crashing, no_expect = blocks_of(
        tmp_path,
        '<!-- check: run expect="^sum 6$" -->\n```python\nprint("sum", 1 + 2 + 3)\n```\n'
        '<!-- check: run expect="^sum 7$" -->\n```python\nprint("sum", 1 + 2 + 3)\n```\n'
        '<!-- check: run expect="never" -->\n```python\nraise SystemExit(3)\n```\n'
        "<!-- check: launch 2 -->\n```python\nprint()\n```\n",
    )
    assert checker.run_block(passing).problems == []
    assert checker.run_block(wrong_output).problems == [
        "the output does not match expect='^sum 7$'"
    ]
    assert "exited with 3" in checker.run_block(crashing).problems
    assert "needs expect" in " ".join(checker.problems_of(no_expect))
