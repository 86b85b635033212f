"""Subcommands that other packages register through the ``accel.commands`` entry-point group.

The plugin distributions here are real ones on ``sys.path`` (a ``.dist-info`` folder and a
module), found by ``importlib.metadata`` exactly as installed packages are.
"""

import importlib.metadata
import textwrap

import pytest

from accel_launch.cli import main
from accel_launch.plugin_commands import KNOWN_COMMANDS


def _install_plugin(root, name: str, entry_points: str, module_source: str) -> None:
    dist = root / f"{name}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(entry_points)
    (root / f"{name}.py").write_text(textwrap.dedent(module_source))


@pytest.fixture
def plugin_root(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return tmp_path


def test_a_registered_command_runs_and_returns_its_exit_code(plugin_root, capsys):
    _install_plugin(
        plugin_root,
        "accel_greeter",
        "[accel.commands]\ngreet = accel_greeter:register\nlaunch = accel_greeter:register\n",
        """
        def register(subparsers):
            parser = subparsers.add_parser("greet", help="Say hello.")
            parser.add_argument("who")
            parser.set_defaults(handler=lambda args: print(f"hello {args.who}") or 3)
        """,
    )
    assert main(["greet", "world"]) == 3
    assert capsys.readouterr().out == "hello world\n"
    with pytest.raises(SystemExit):  # the command's own parser answers its --help
        main(["greet", "--help"])
    assert "usage: accel greet [-h] who" in capsys.readouterr().out
    main_help = main.__module__  # the built-in launch command was not replaced
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = capsys.readouterr().out
    assert "greet" in listing and "Run a script on one or many processes." in listing, main_help


def test_a_broken_command_names_itself_and_the_error(plugin_root, capsys):
    _install_plugin(
        plugin_root,
        "accel_broken",
        "[accel.commands]\nbroken = accel_broken:register\n",
        "raise ImportError('needs a library that is not installed')\n",
    )
    with pytest.raises(SystemExit):  # listing commands does not import them
        main(["--help"])
    assert "broken" in capsys.readouterr().out
    assert main(["broken", "--anything"]) == 1
    error = capsys.readouterr().err
    assert "broken command of accel_broken:register failed to load" in error
    assert "needs a library that is not installed" in error


@pytest.mark.parametrize("command", sorted(KNOWN_COMMANDS))
def test_a_known_command_of_an_absent_package_says_what_to_install(command, capsys):
    package = KNOWN_COMMANDS[command]
    try:
        importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        pytest.skip(f"{package} is installed here; its {command} command is tested with it")
    assert main([command, "x", "y"]) == 1
    assert f"install {package} for {command}" in capsys.readouterr().err
