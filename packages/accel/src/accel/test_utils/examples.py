r"""Accelerate's ``accelerate.test_utils.examples``: does a complete example hold a feature's code?

Accelerate's repository (and accel's, under ``examples/``) has a plain template script, one
script per feature (``by_feature/checkpointing.py``...) and "complete" scripts that combine them.
:func:`compare_against_test` lists the lines a feature script adds to the template that a
complete script lacks; a test asserts the list is empty.

Example:
    >>> lines = ["import os\n", "def main():\n", "    # parse\n", "    run()\n", "\n", "main()\n"]
    >>> clean_lines(get_function_contents_by_name(lines, "main"))
    ['def main():\n', '    run()\n']
"""

from __future__ import annotations

import os
from collections.abc import Sequence

#: Lines a feature script may add for its own tests only (and the line after such a marker).
_TEST_MARKER = "TESTING_MOCKED_DATALOADERS"
_DATALOADER_LINE = "train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)"

__all__ = ["clean_lines", "compare_against_test", "get_function_contents_by_name"]


def get_function_contents_by_name(lines: Sequence[str], name: str) -> list[str]:
    """The lines of the top-level function ``name`` in ``lines``: its ``def`` line and body.

    The body ends at the next line that starts at column 0 (blank lines inside are kept).

    Raises:
        ValueError: ``lines`` defines no top-level function ``name``.
    """
    body: list[str] = []
    for line in lines:
        if not body:
            if line.startswith((f"def {name}(", f"async def {name}(")):
                body.append(line)
            continue
        if line.strip() and not line[0].isspace() and not line.lstrip().startswith(")"):
            break
        body.append(line)
    if not body:
        raise ValueError(f"no top-level function {name!r} in the given lines; pass its name")
    while body and not body[-1].strip():
        body.pop()
    return body


def clean_lines(lines: Sequence[str]) -> list[str]:
    """``lines`` without blank lines and comment-only lines."""
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _function_lines(path: str | os.PathLike[str], name: str) -> list[str]:
    with open(path, encoding="utf-8") as file:
        return clean_lines(get_function_contents_by_name(file.readlines(), name))


def _without_test_only(lines: list[str]) -> list[str]:
    kept: list[str] = []
    skip_next = False
    for line in lines:
        if skip_next:
            skip_next = False
        elif _TEST_MARKER in line:
            skip_next = True
        elif line.strip() != _DATALOADER_LINE:
            kept.append(line)
    return kept


def compare_against_test(
    base_filename: str | os.PathLike[str],
    feature_filename: str | os.PathLike[str],
    parser_only: bool,
    secondary_filename: str | os.PathLike[str] | None = None,
    *,
    template_filename: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Lines that ``feature_filename`` adds to the template and ``base_filename`` lacks.

    Args:
        base_filename: The complete example that should contain the feature.
        feature_filename: The feature's example script.
        parser_only: Compare the ``main`` functions (argument parsing) instead of the
            ``training_function`` functions.
        secondary_filename: Another template the complete example is built on (its function's
            lines do not count as new).
        template_filename: The plain script every feature script starts from (default:
            ``examples/nlp_example.py`` under the current folder, Accelerate's layout).

    Returns:
        The missing lines, in the feature script's order (empty when the example has them all).
    """
    name = "main" if parser_only else "training_function"
    template = template_filename or os.path.join("examples", "nlp_example.py")
    known = set(_function_lines(template, name))
    if secondary_filename is not None:
        known |= set(_function_lines(secondary_filename, name))
    in_base = set(_function_lines(base_filename, name))
    feature = _without_test_only(_function_lines(feature_filename, name))
    return [line for line in feature if line not in known and line not in in_base]
