"""The plan reads one source after merging flags and config file (issue 57, item 4).

``build_plan`` reads the parsed namespace once, at the merge: the typed config keys
(``flags_to_config``) and the rest of the command line (:class:`LaunchOptions`). After that only
the merged config, the typed flags and the options are read.
"""

import argparse
import importlib.util

import pytest
from launch_helpers import SCRIPTS

from accel_launch import plan as plan_module
from accel_launch.config import AccelConfig
from accel_launch.errors import LaunchArgumentError
from accel_launch.launch_args import build_launch_parser
from accel_launch.plan import LaunchOptions, build_plan

SCRIPT = str(SCRIPTS / "plain_worker.py")
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


class SealableNamespace(argparse.Namespace):
    """A namespace that fails any attribute read once sealed."""

    def __getattribute__(self, name: str) -> object:
        if not name.startswith("_") and object.__getattribute__(self, "__dict__").get("_sealed"):
            raise AssertionError(f"args.{name} read after the merge")
        return object.__getattribute__(self, name)


def parse(*flags: str) -> argparse.Namespace:
    return build_launch_parser().parse_args([*flags, SCRIPT, "x"], namespace=SealableNamespace())


@pytest.mark.parametrize(
    "flags",
    [
        # One process: the elastic-only flags become notes.
        ("--tee", "3", "--log_dir", "logs", "--role", "r", "--rdzv_conf", "a=1"),
        ("--monitor_interval", "1", "--main_training_function", "f", "--quiet"),
        # Torch elastic on one machine: --rdzv_backend static is noted; --env, --as_accelerate.
        ("--num_processes", "2", "--rdzv_backend", "static", "--env", "A=1", "--as_accelerate"),
        # An elastic range: typed --rdzv_backend / --machine_rank decide errors and notes.
        ("--num_machines", "1:2", "--main_process_ip", "h", "--rdzv_backend", "c10d"),
        # Replica groups.
        ("--ft_replicas", "2", "--ft_min_replicas", "1"),
        # XLA with bf16 downcasting.
        ("--tpu", "--mixed_precision", "bf16", "--downcast_bf16", "--main_training_function", "f"),
    ],
)
def test_nothing_is_read_from_the_namespace_after_the_merge(monkeypatch, flags):
    read_options = LaunchOptions.from_args

    def read_then_seal(args: argparse.Namespace) -> LaunchOptions:
        options = read_options(args)
        args._sealed = True
        return options

    monkeypatch.setattr(plan_module.LaunchOptions, "from_args", read_then_seal)
    cpu = () if "--tpu" in flags else ("--cpu",)
    if "--as_accelerate" in flags and importlib.util.find_spec("accel") is None:
        # accel-launch installed alone (its own test leg): the option, read from the options and
        # not from the sealed namespace, is refused because accel is missing.
        with pytest.raises(LaunchArgumentError, match="--as_accelerate serves"):
            build_plan(parse(*cpu, *flags), None, NO_GPU)
        return
    plan = build_plan(parse(*cpu, *flags), None, NO_GPU)
    assert plan.target == SCRIPT and plan.target_args == ("x",)
    if "--as_accelerate" in flags:
        assert plan.env["ACCEL_AS_ACCELERATE"] == "1"


def test_the_options_carry_the_command_line_settings_into_the_plan():
    args = parse(
        "--cpu", "--num_processes", "2", "--tee", "3", "--log_dir", "logs", "--role", "trainer",
        "--quiet", "--env", "A=1", "--env", "B=x=y", "-m", "--ft_replicas", "2",
    )  # fmt: skip
    options = LaunchOptions.from_args(args)
    assert options == LaunchOptions(
        target=SCRIPT,
        target_args=("x",),
        module=True,
        tee="3",
        log_dir="logs",
        role="trainer",
        quiet=True,
        env=("A=1", "B=x=y"),
        ft_replicas=2,
    )
    plan = build_plan(args, None, NO_GPU)
    assert (plan.tee, plan.log_dir, plan.role, plan.quiet, plan.module) == (
        "3", "logs", "trainer", True, True,
    )  # fmt: skip
    assert (plan.env["A"], plan.env["B"]) == ("1", "x=y")
    assert plan.fault_tolerance is not None and plan.fault_tolerance.replicas == 2
    defaults = build_plan(parse("--cpu"), None, NO_GPU)
    assert (defaults.tee, defaults.log_dir, defaults.role, defaults.quiet) == (
        None, None, "default", False,
    )  # fmt: skip


def test_a_hand_built_namespace_gives_default_options():
    assert LaunchOptions.from_args(argparse.Namespace()) == LaunchOptions()


def test_config_file_values_are_honoured_and_only_typed_flags_are_refused_or_noted():
    # main_training_function: from the file it is used on XLA and silent elsewhere.
    config = AccelConfig.from_mapping({"main_training_function": "train"})
    xla = build_plan(parse("--tpu"), config, NO_GPU)
    assert xla.main_training_function == "train"
    plain = build_plan(parse("--cpu"), config, NO_GPU)
    assert not any("main_training_function" in note for note in plain.notes)
    typed = build_plan(parse("--cpu", "--main_training_function", "train"), None, NO_GPU)
    assert any("--main_training_function only acts" in note for note in typed.notes)
    # downcast_bf16: from the file it is ignored off XLA; typed, it is refused.
    config = AccelConfig.from_mapping({"downcast_bf16": True, "mixed_precision": "bf16"})
    assert "XLA_DOWNCAST_BF16" not in build_plan(parse("--cpu"), config, NO_GPU).env
    assert build_plan(parse("--tpu"), config, NO_GPU).env["XLA_DOWNCAST_BF16"] == "1"
    with pytest.raises(LaunchArgumentError, match="--downcast_bf16 only applies to XLA"):
        build_plan(parse("--cpu", "--downcast_bf16"), None, NO_GPU)
    # rdzv_backend static on one machine: noted only when typed.
    config = AccelConfig.from_mapping({"rdzv_backend": "static", "num_processes": 2})
    assert not any("static is for several" in n for n in build_plan(parse("--cpu"), config).notes)
    typed_static = build_plan(parse("--cpu", "--rdzv_backend", "static"), config, NO_GPU)
    assert any("static is for several machines" in note for note in typed_static.notes)
