"""Accelerate's hyphenated flag spellings parse exactly like the underscored ones."""

import argparse

import pytest
from launch_helpers import SCRIPTS

from accel_launch.cli import build_parser
from accel_launch.launch_args import build_launch_parser

SCRIPT = str(SCRIPTS / "plain_worker.py")


def _value(action: argparse.Action) -> list[str]:
    """A valid value for ``action`` on the command line (none for a switch)."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(list(action.choices)[-1])]
    if action.type is int:
        return ["2"]
    if action.type is float:
        return ["1.5"]
    if action.metavar == "{true,false}":
        return ["true"]
    if action.metavar == "N|MIN:MAX":
        return ["2:3"]
    return ["value"]


def _multi_word_flags(parser: argparse.ArgumentParser) -> list[tuple[str, list[str]]]:
    flags = []
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and "_" in option:
                flags.append((option, _value(action)))
    return flags


def _subparser(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    for name in names:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[name]
    return parser


def test_every_launch_flag_has_an_identical_hyphenated_spelling():
    parser = build_launch_parser()
    flags = _multi_word_flags(parser)
    assert len(flags) > 50  # every multi-word flag, not a hand-picked few
    for option, value in flags:
        twin = option.replace("_", "-")
        underscored = parser.parse_args([option, *value, SCRIPT, "--keep_me", "a-b"])
        hyphenated = parser.parse_args([twin, *value, SCRIPT, "--keep_me", "a-b"])
        assert vars(underscored) == vars(hyphenated), option
        # The script's own arguments are never rewritten.
        assert hyphenated.training_script_args == ["--keep_me", "a-b"]


def test_accel_launch_and_config_accept_both_and_help_shows_one(capsys):
    parser = build_parser()
    one = parser.parse_args(
        [
            "launch",
            "--num-processes",
            "2",
            "--mixed-precision=bf16",
            "--main-process-port",
            "29511",
            "--config-file",
            "c.yaml",
            SCRIPT,
        ]
    )
    other = parser.parse_args(
        [
            "launch",
            "--num_processes",
            "2",
            "--mixed_precision=bf16",
            "--main_process_port",
            "29511",
            "--config_file",
            "c.yaml",
            SCRIPT,
        ]
    )
    assert vars(one) == vars(other)
    assert (one.num_processes, one.mixed_precision, one.main_process_port) == (2, "bf16", 29511)
    for path in (["config"], ["config", "default"], ["config", "update"]):
        sub = _subparser(parser, *path)
        for option, value in _multi_word_flags(sub):
            a = parser.parse_args([*path, option, *value])
            b = parser.parse_args([*path, option.replace("_", "-"), *value])
            assert vars(a) == vars(b), (path, option)
    for path in (["launch"], ["config"], ["config", "default"]):
        help_text = _subparser(parser, *path).format_help()
        assert "--config_file" in help_text and "--config-file" not in help_text
    launch_help = _subparser(parser, "launch").format_help()
    # The options list shows one spelling; the description names the hyphenated one once (as
    # Accelerate's help does), to say it is accepted.
    options = launch_help.split("positional arguments:", 1)[1]
    assert "--num_processes" in options and "--num-processes" not in options
    assert launch_help.count("--num-processes") == 1


def test_a_hyphenated_typo_is_still_an_error(capsys):
    with pytest.raises(SystemExit):
        build_launch_parser().parse_args(["--num-process", "2", SCRIPT])
    assert "unrecognized arguments: --num-process" in capsys.readouterr().err
