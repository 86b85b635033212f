"""A griffe extension for the docs build: Sphinx roles in docstrings become code spans.

accel's docstrings cross-reference with Sphinx roles (``:class:`DataLoaderShard```,
``:meth:`~accel.Accelerator.prepare```), which Markdown would print as they are. mkdocs.yml
loads this extension for mkdocstrings; each role becomes an inline code span of its target (the
last component where the target starts with ``~``, as Sphinx shows it). Docstrings in the
sources are not changed.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|mod|exc|obj|const):`(~?)([^`]+)`")


def plain_roles(text: str) -> str:
    """``text`` with every Sphinx role replaced by a code span of its target."""

    def code(match: re.Match[str]) -> str:
        target = match.group(2).strip()
        return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"

    return ROLE.sub(code, text)


class RstRoles(Extension):
    """Rewrite Sphinx roles in every docstring once griffe has loaded the object tree."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring in place (griffe's copy only)."""
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
