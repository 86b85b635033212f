"""Record which Accelerate names the libraries' own code reaches in this process.

A job script imports this module before it imports transformers, PEFT or TRL. When
``ECOSYSTEM_NAME_SITES`` names a file written by ``accelerate_names.write_sites`` (``{key: {file:
lines}}``), a trace function watches exactly those source lines: only code objects that hold one
are traced line by line, and each stops being traced once all of its lines ran, so the job runs
at nearly full speed. Every key whose line ran is written to ``names-used-<pid>.json`` in the
working directory as soon as it is first seen (a rank that is killed keeps what it reached).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

SITES_ENV = "ECOSYSTEM_NAME_SITES"
_Tracer = Any  # the trace-function protocol is untyped in typeshed


class NameUseRecorder:
    """Traces the given source lines and records the keys whose lines ran."""

    def __init__(self, sites: dict[str, dict[str, list[int]]], out: Path) -> None:
        self.out = out
        self.used: set[str] = set()
        #: ``{file: {line: keys}}`` of the lines not yet seen.
        self._pending: dict[str, dict[int, set[str]]] = {}
        for key, files in sites.items():
            for path, lines in files.items():
                for line in lines:
                    self._pending.setdefault(path, {}).setdefault(line, set()).add(key)
        self._wanted: dict[CodeType, set[int]] = {}
        self._relative: dict[str, str] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        """Trace this thread and every thread started from now on."""
        threading.settrace(self._on_call)
        sys.settrace(self._on_call)

    def _lines_of(self, code: CodeType) -> set[int]:
        wanted = self._wanted.get(code)
        if wanted is None:
            pending = self._pending.get(self._relative_name(code.co_filename))
            own = {line for _, _, line in code.co_lines() if line is not None} if pending else set()
            wanted = {line for line in own if pending and line in pending}
            self._wanted[code] = wanted
        return wanted

    def _relative_name(self, filename: str) -> str:
        """``.../site-packages/transformers/trainer.py`` -> ``transformers/trainer.py``."""
        relative = self._relative.get(filename)
        if relative is None:
            parts = Path(filename).parts
            relative = filename
            for index in range(len(parts) - 1, 0, -1):
                if "/".join(parts[index:]) in self._pending:
                    relative = "/".join(parts[index:])
                    break
            self._relative[filename] = relative
        return relative

    def _on_call(self, frame: FrameType, event: str, arg: object) -> _Tracer:
        if event != "call" or not self._lines_of(frame.f_code):
            return None
        return self._on_line

    def _on_line(self, frame: FrameType, event: str, arg: object) -> _Tracer:
        if event != "line":
            return self._on_line
        wanted = self._wanted[frame.f_code]
        if frame.f_lineno in wanted:
            self._seen(frame.f_code, frame.f_lineno)
            if not wanted:
                return None
        return self._on_line

    def _seen(self, code: CodeType, line: int) -> None:
        with self._lock:
            self._wanted[code].discard(line)
            keys = self._pending[self._relative_name(code.co_filename)].pop(line, set())
            new = keys - self.used
            if not new:
                return
            self.used |= new
            self.out.write_text(json.dumps(sorted(self.used)))


def start_from_env() -> NameUseRecorder | None:
    """Start recording when ``ECOSYSTEM_NAME_SITES`` is set; return the recorder, or None."""
    sites_file = os.environ.get(SITES_ENV)
    if not sites_file:
        return None
    sites = json.loads(Path(sites_file).read_text())
    recorder = NameUseRecorder(sites, Path.cwd() / f"names-used-{os.getpid()}.json")
    recorder.start()
    return recorder


def used_names(folder: Path) -> set[str]:
    """Every key any process of the job that ran in ``folder`` recorded."""
    used: set[str] = set()
    for path in folder.glob("names-used-*.json"):
        used.update(json.loads(path.read_text()))
    return used


#: Importing this module starts recording (when the variable is set): job scripts import it first.
RECORDER = start_from_env()
