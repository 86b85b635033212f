"""The alias beside a real Accelerate install: it wins when asked for, changes nothing otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ecosystem_jobs import job_env, require_libraries

require_libraries()

PROBE = """
import importlib.metadata, json, sys
{install}
import accelerate, accelerate.utils.modeling
import transformers
from transformers.utils import is_accelerate_available
print(json.dumps({{
    "file": accelerate.__file__,
    "version": accelerate.__version__,
    "metadata": importlib.metadata.version("accelerate"),
    "transformers_sees": is_accelerate_available(),
    "is_accel": "accel" in sys.modules and accelerate.Accelerator is sys.modules["accel"].Accelerator,
    "modeling_is_accel": accelerate.utils.modeling.__name__,
}}))
"""


def probe(install: str, tmp_path: Path, **extra_env: str) -> dict[str, object]:
    env = {**job_env(tmp_path), **extra_env}
    completed = subprocess.run(
        [sys.executable, "-c", PROBE.format(install=install)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_real_accelerate_is_installed_here() -> None:
    """The premise: PEFT and TRL pulled the real Accelerate into this venv."""
    import importlib.metadata

    assert importlib.metadata.version("accelerate") == "1.15.0"


def test_without_the_alias_nothing_changes(tmp_path: Path) -> None:
    result = probe("", tmp_path)
    assert result["version"] == result["metadata"] == "1.15.0"
    assert result["is_accel"] is False
    assert result["modeling_is_accel"] == "accelerate.utils.modeling"
    assert os.sep + "accelerate" + os.sep in str(result["file"])


def test_install_as_accelerate_wins_over_the_real_one(tmp_path: Path) -> None:
    result = probe("import accel; accel.install_as_accelerate()", tmp_path)
    assert str(result["version"]).startswith("1.15.0+accel.")
    assert result["metadata"] == result["version"]
    assert result["transformers_sees"] is True
    assert result["is_accel"] is True
    assert result["modeling_is_accel"] == "accel.utils.modeling"


def test_the_start_up_hook_wins_over_the_real_one(tmp_path: Path) -> None:
    result = probe("", tmp_path, ACCEL_AS_ACCELERATE="1")
    assert result["is_accel"] is True
    assert result["metadata"] == result["version"]
