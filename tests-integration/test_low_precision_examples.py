"""The low-precision examples, run as a user would: fp8 through ``accel launch``, 8/4-bit plain."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import EXAMPLES, launch

pytestmark = pytest.mark.timeout(600)


def test_fp8_example_trains_through_the_launchers_fp8_flags(clean_env):
    pytest.importorskip("torchao", reason="needs accel[fp8] (accel[test] installs torchao)")
    result = launch(
        EXAMPLES / "by_feature" / "fp8_training.py",
        "--steps",
        "8",
        env=clean_env,
        flags=("--mixed_precision", "fp8", "--fp8_backend", "ao", "--fp8_pad_inner_dim", "true"),
        timeout=500,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "fp8 layers: ['blocks.0.up', 'blocks.0.down', 'blocks.1.up', 'blocks.1.down']" in out
    assert "has_ao_layers: True" in out and "loaded into a plain TinyLM: Linear" in out


def test_8bit_example_offloads_with_the_same_outputs(clean_env):
    pytest.importorskip("bitsandbytes", reason="needs accel[bnb] (accel[test] installs it)")
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "by_feature" / "big_model_8bit.py")],
        capture_output=True,
        text=True,
        timeout=500,
        env=clean_env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("same output: True") == 2, result.stdout
    assert "4-bit layers: True" in result.stdout
