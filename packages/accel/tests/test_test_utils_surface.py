"""accel.test_utils at Accelerate's names, its test programs, and the estimate/env command APIs."""

import argparse
import subprocess
import sys
import unittest
from unittest import mock

import pytest

import accel.test_utils as test_utils
import accel.test_utils.requirements as requirements
import accel.test_utils.testing as testing
import accel.utils as utils
from accel import debug_launcher
from accel.commands.env import env_command, env_command_parser
from accel.commands.estimate import (
    add_timm_hub_prefix,
    estimate_command,
    estimate_command_parser,
    gather_data,
)
from accel.commands.memory_spec import HubModelError


def test_testing_names_are_the_same_objects_everywhere():
    for name in ("require_timm", "require_trackers", "require_non_hpu", "require_datasets"):
        assert getattr(testing, name) is getattr(requirements, name)
    for name in ("is_hpu_available", "is_timm_available", "is_torch_version"):
        assert getattr(testing, name) is getattr(utils, name)
    assert test_utils.require_pippy is testing.require_pippy
    missing = [name for name in testing.__all__ if not hasattr(testing, name)]
    assert missing == []


def test_skip_decorators_skip_with_the_reason():
    @testing.require_import_timer
    class Case(unittest.TestCase):
        def test_it(self) -> None:
            pass

    if not utils.is_import_timer_available():
        result = unittest.TestResult()
        Case("test_it").run(result)
        assert result.skipped and "import_timer" in result.skipped[0][1]


def test_parse_flag_from_env_names_the_variable(monkeypatch):
    monkeypatch.setenv("ACCEL_TEST_FLAG", "yes")
    assert testing.parse_flag_from_env("ACCEL_TEST_FLAG") is True
    monkeypatch.setenv("ACCEL_TEST_FLAG", "maybe")
    with pytest.raises(ValueError, match="ACCEL_TEST_FLAG must be yes or no"):
        testing.parse_flag_from_env("ACCEL_TEST_FLAG")


def test_run_command_returns_output_and_raises_with_it():
    out = testing.run_command([sys.executable, "-c", "print('hi')"], return_stdout=True)
    assert out is not None and out.strip() == "hi"
    with pytest.raises(testing.SubprocessCallException, match="boom"):
        testing.run_command([sys.executable, "-c", "import sys; sys.exit('boom')"])


def test_mocking_test_case_starts_and_stops_patches():
    class Case(testing.MockingTestCase):
        def setUp(self) -> None:
            super().setUp()
            self.add_mocks(mock.patch.object(subprocess, "DEVNULL", "patched"))

        def test_it(self) -> None:
            assert subprocess.DEVNULL == "patched"

    result = unittest.TestResult()
    Case("test_it").run(result)
    assert result.wasSuccessful() and subprocess.DEVNULL != "patched"


def test_test_programs_are_importable_at_accelerates_paths():
    from accel.test_utils.scripts import test_ops, test_script, test_sync
    from accel.test_utils.scripts.external_deps import test_metrics

    assert test_utils.test_ops is test_ops and test_utils.test_sync is test_sync
    assert callable(test_script.main) and callable(test_metrics.main)


def test_ops_program_passes_on_two_processes():
    debug_launcher(test_utils.test_ops.main, num_processes=2)


def test_timm_hub_prefix_and_hub_names():
    assert add_timm_hub_prefix("resnet50") == "resnet50"
    assert add_timm_hub_prefix("timm/resnet50.a1_in1k") == "hf-hub:timm/resnet50.a1_in1k"
    assert add_timm_hub_prefix("local-dir:/m") == "local-dir:/m"
    args = estimate_command_parser().parse_args(["somebrokenname"])
    with pytest.raises(OSError, match="accel cannot download Hub models") as caught:
        estimate_command(args)
    assert isinstance(caught.value, HubModelError)


def test_gather_data_rows_in_accelerates_layout(monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    args = estimate_command_parser().parse_args(["estimate_models:Small", "--dtypes", "float32"])
    (row,) = gather_data(args)
    dtype, largest, total, training = row
    assert dtype == "float32" and 0 < largest <= total
    assert training["step"] == 4 * total and training["optimizer"] == 2 * total


def test_env_command_returns_accelerates_keys(capsys):
    args = env_command_parser().parse_args([])
    with mock.patch("accel.commands.env.which", return_value=None):
        info = env_command(args)
    assert info["`accelerate` bash location"] == "Not found"
    assert "PyTorch version" in info and isinstance(args, argparse.Namespace)


def test_to_fsdp2_command_logs_an_fsdp2_config_and_refuses_to_clobber(tmp_path, caplog):
    from accel.commands.to_fsdp2 import to_fsdp2_command, to_fsdp2_command_parser

    source = tmp_path / "in.yaml"
    source.write_text("fsdp_config:\n  fsdp_version: 2\n")
    out = tmp_path / "out.yaml"
    parser = to_fsdp2_command_parser()
    args = parser.parse_args(["--config_file", str(source), "--output_file", str(out)])
    with caplog.at_level("WARNING"):
        to_fsdp2_command(args)
    assert "Config already specifies FSDP2, skipping conversion..." in caplog.text
    assert out.is_file()
    with pytest.raises(FileExistsError, match="--overwrite"):
        to_fsdp2_command(args)
