"""accel.test_utils.examples on sample scripts, and the coverage script's submodule-path check."""

import pathlib

import pytest

from accel.test_utils.examples import (
    clean_lines,
    compare_against_test,
    get_function_contents_by_name,
)

TEMPLATE = """import argparse


def training_function(config, args):
    model = build()
    # train
    for batch in loader:
        step(batch)


def main():
    parser = argparse.ArgumentParser()
    args = parser.parse_args()
    training_function({}, args)


if __name__ == "__main__":
    main()
"""
# A feature script: the template plus checkpointing (one line in the function, one flag).
FEATURE = TEMPLATE.replace(
    "        step(batch)\n", "        step(batch)\n    accelerator.save_state(args.output_dir)\n"
).replace(
    "    args = parser.parse_args()\n",
    '    parser.add_argument("--output_dir")\n    args = parser.parse_args()\n',
)


def _write(folder: pathlib.Path, name: str, text: str) -> pathlib.Path:
    path = folder / name
    path.write_text(text)
    return path


def test_function_contents_and_clean_lines():
    lines = TEMPLATE.splitlines(keepends=True)
    body = get_function_contents_by_name(lines, "training_function")
    assert body[0] == "def training_function(config, args):\n"
    assert body[-1] == "        step(batch)\n" and "    # train\n" in body
    assert clean_lines(body) == [line for line in body if "#" not in line]
    assert get_function_contents_by_name(lines, "main")[-1] == "    training_function({}, args)\n"
    with pytest.raises(ValueError, match="evaluate"):
        get_function_contents_by_name(lines, "evaluate")


def test_compare_against_test_lists_what_the_complete_example_lacks(tmp_path):
    template = _write(tmp_path, "nlp_example.py", TEMPLATE)
    feature = _write(tmp_path, "checkpointing.py", FEATURE)
    lacking = _write(tmp_path, "complete_lacking.py", TEMPLATE)
    complete = _write(tmp_path, "complete.py", FEATURE.replace("build()", "build(big=True)"))

    kwargs = {"template_filename": template}
    assert compare_against_test(lacking, feature, False, **kwargs) == [
        "    accelerator.save_state(args.output_dir)\n"
    ]
    assert compare_against_test(lacking, feature, True, **kwargs) == [
        '    parser.add_argument("--output_dir")\n'
    ]
    assert compare_against_test(complete, feature, False, **kwargs) == []
    # A secondary template's lines do not count as the feature's.
    assert compare_against_test(lacking, feature, False, str(feature), **kwargs) == []


def test_compare_against_test_reads_accelerates_template_path(tmp_path, monkeypatch):
    (tmp_path / "examples").mkdir()
    _write(tmp_path / "examples", "nlp_example.py", TEMPLATE)
    feature = _write(tmp_path, "checkpointing.py", FEATURE)
    lacking = _write(tmp_path, "complete_lacking.py", TEMPLATE)
    monkeypatch.chdir(tmp_path)
    assert compare_against_test(str(lacking), str(feature), False) == [
        "    accelerator.save_state(args.output_dir)\n"
    ]


def test_submodule_paths_are_classified(tmp_path, monkeypatch, coverage_script):
    script = coverage_script
    listed = script.classify_submodule("accelerate.test_utils.scripts.test_notebook", "accel.x")
    assert listed.status == "listed" and "nox -s peer" in listed.note
    own = "accel.test_utils.scripts.test_sync"
    assert script.classify_submodule("accelerate.test_utils.scripts.test_sync", own).status == (
        "imports"
    )
    assert script.classify_submodule("accelerate.commands.tpu", "accel.commands.tpu").status == (
        "imports"
    )
    missing = script.classify_submodule("accelerate.nowhere", "accel.nowhere")
    assert missing.status == "fails" and "accel.nowhere" in missing.note
    (tmp_path / "needs_optional_twin.py").write_text("import not_installed_library_xyz\n")
    (tmp_path / "broken_twin.py").write_text("raise RuntimeError('broken on import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    needs = script.classify_submodule("accelerate.utils.rich", "needs_optional_twin")
    assert (needs.status, needs.note) == (
        "needs",
        "imports once `not_installed_library_xyz` is installed",
    )
    broken = script.classify_submodule("accelerate.utils.rich", "broken_twin")
    assert (broken.status, broken.note) == ("fails", "RuntimeError: broken on import")


def test_check_fails_on_a_submodule_path_without_a_twin_or_reason(capsys, coverage_script):
    script = coverage_script
    names = [script.Entry("accelerate", "Accelerator", "same", "")]
    paths = [
        script.Submodule("accelerate.commands.env", "imports", ""),
        script.Submodule("accelerate.utils.rich", "needs", "imports once `rich` is installed"),
        script.Submodule("accelerate.test_utils.scripts", "listed", "their own tests"),
        script.Submodule("accelerate.test_utils.scripts.test_ops", "listed", "their own tests"),
    ]
    assert script.main(["--check"], lambda: ("9.9", names), lambda: paths) == 0
    captured = capsys.readouterr()
    counts = "2 of 4 submodule paths import (1 once their optional library is installed); 2 listed"
    assert counts in captured.err and counts in captured.out
    assert "| `accelerate.test_utils.scripts` and 1 more | listed | their own tests |" in (
        captured.out
    )
    assert "accelerate.commands.env" not in captured.out  # only the exceptions are listed

    failing = [*paths, script.Submodule("accelerate.commands.new", "fails", "ImportError: x")]
    assert script.main(["--check"], lambda: ("9.9", names), lambda: failing) == 1
    assert "accelerate.commands.new (ImportError: x)" in capsys.readouterr().err
    assert script.main([], lambda: ("9.9", names), lambda: failing) == 0  # printing only


FAKE_MODULE = """import os
from os.path import join
from .sibling import Helper, reached_name
from . import sibling

CONSTANT = 1
logger = None
_private = 2


def function(a, b=1):
    return a


def _hidden():
    pass


class Thing:
    def _member(self):
        pass


try:
    from .sibling import optional_name
except ImportError:
    pass
if os.name == "never":
    ON_OTHER_PLATFORMS = 1
"""


def test_module_names_are_definitions_reached_imports_and_listed_private_names(
    tmp_path, monkeypatch, coverage_script
):
    script = coverage_script
    package = tmp_path / "fake_accelerate_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .sibling import Helper\nfrom .mod import function\n")
    (package / "sibling.py").write_text(
        "class Helper:\n    pass\n\n\ndef reached_name():\n    pass\n\n\noptional_name = 3\n"
    )
    (package / "mod.py").write_text(FAKE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(script, "REACHED_IMPORTS", {"fake_accelerate_pkg.mod": ("reached_name",)})
    monkeypatch.setattr(
        script, "PRIVATE_NAMES", {"fake_accelerate_pkg.mod": ("_hidden", "Thing._member")}
    )
    import importlib

    module = importlib.import_module("fake_accelerate_pkg.mod")
    expected = ["CONSTANT", "Thing", "Thing._member", "_hidden", "function", "logger"]
    # Imports count only where reached; a name bound on another platform only is not there.
    assert script.module_names("fake_accelerate_pkg.mod", module) == sorted(
        [*expected, "reached_name"]
    )
    # Read from source alone (Accelerate's module does not import here): no runtime filter.
    assert script.module_names("fake_accelerate_pkg.mod", None) == sorted(
        [*expected, "ON_OTHER_PLATFORMS", "reached_name"]
    )
    # A package's imports are its names (it is a re-export module).
    package_module = importlib.import_module("fake_accelerate_pkg")
    assert script.module_names("fake_accelerate_pkg", package_module) == ["Helper", "function"]
    module.__all__ = ["function"]
    assert script.module_names("fake_accelerate_pkg.mod", module) == [
        "Thing._member",
        "_hidden",
        "function",
    ]


def test_re_exports_must_be_the_same_object_and_share_their_reasons(capsys, coverage_script):
    script = coverage_script

    def theirs_function(a):
        return a

    def ours_function(a):
        return a

    def ours_copy(a):
        return a

    class TheirConfig:
        pass

    theirs_tpu = object()
    rows = [
        # accel.utils.f is documented; accel.utils.operations.f is another object: mismatch.
        ("accelerate.utils", "f", True, theirs_function, ours_function),
        ("accelerate.utils.operations", "f", True, theirs_function, ours_copy),
        # Absent under a deep path while accel has it in accel.utils: a missing re-export.
        ("accelerate.utils.other", "f", False, theirs_function, None),
        # A NOTES entry of accelerate.utils covers the same object under its module path.
        ("accelerate.utils", "prepare_tpu", True, theirs_tpu, theirs_tpu),
        ("accelerate.utils.launch", "prepare_tpu", True, theirs_tpu, theirs_tpu),
        # A reason recorded for accelerate.utils carries over where accel lacks both.
        ("accelerate.utils", "HfDeepSpeedConfig", False, TheirConfig, None),
        ("accelerate.utils.deepspeed", "HfDeepSpeedConfig", False, TheirConfig, None),
    ]
    entries = {(e.namespace, e.name): e for e in script.compare(rows)}
    assert entries[("accelerate.utils", "f")].reference == ""
    assert entries[("accelerate.utils.operations", "f")].reference == "accel.utils.f"
    missing = entries[("accelerate.utils.other", "f")]
    assert (missing.status, missing.note, missing.reference) == ("absent", "", "accel.utils.f")
    launch_tpu = entries[("accelerate.utils.launch", "prepare_tpu")]
    assert (launch_tpu.status, launch_tpu.declared) == ("differs", True)
    deep = entries[("accelerate.utils.deepspeed", "HfDeepSpeedConfig")]
    assert deep.status == "absent" and "DeepSpeed" in deep.note

    names = list(entries.values())
    assert script.main(["--check"], collector=lambda: ("9.9", names)) == 1
    err = capsys.readouterr().err
    assert "accelerate.utils.other.f (accel has accel.utils.f)" in err
    assert "accel.utils.operations.f (not accel.utils.f)" in err
    assert "accelerate.utils.launch.prepare_tpu" not in err
    section = script.render("9.9", names)
    assert "| `accel.utils.operations.f` | `accel.utils.f` |" in section
    assert script.MISSING_REEXPORT in section


def test_test_program_helpers_are_listed_but_their_main_must_match(tmp_path, coverage_script):
    script = coverage_script
    path = "accelerate.test_utils.scripts.test_ops"
    helper = script.classify(path, "test_gather", False, None, None)
    assert helper.status == "absent" and "test program" in helper.note
    assert script.classify(path, "main", False, None, None).note == ""
    # logger is a module's own; other hardware-free names keep no reason.
    assert script.classify("accelerate.state", "logger", False, None, None).note
    assert script.classify("accelerate.state", "SharedDict", False, None, None).note == ""

    absent, signatures = tmp_path / "absent.txt", tmp_path / "signatures.txt"
    entries = [
        script.Entry(path, "main", "absent", ""),
        script.Entry("accelerate.utils", "g", "differs", "lacks parameters x"),
    ]
    script.write_lists(entries, str(absent), str(signatures))
    assert absent.read_text() == f"{path}\tmain\t(no reason recorded)\n"
    assert signatures.read_text() == "accelerate.utils\tg\tundeclared\tlacks parameters x\n"
