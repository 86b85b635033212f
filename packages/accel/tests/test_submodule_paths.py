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
    assert "| `accelerate.test_utils.scripts` and the 1 below it | listed | their own tests |" in (
        captured.out
    )
    assert "`accelerate.commands.env`" in captured.out.split("Module paths that import")[1]

    failing = [*paths, script.Submodule("accelerate.commands.new", "fails", "ImportError: x")]
    assert script.main(["--check"], lambda: ("9.9", names), lambda: failing) == 1
    assert "accelerate.commands.new (ImportError: x)" in capsys.readouterr().err
    assert script.main([], lambda: ("9.9", names), lambda: failing) == 0  # printing only


def test_listed_paths_that_do_not_nest_are_named_one_by_one(coverage_script):
    script = coverage_script
    paths = [
        script.Submodule("accelerate.test_utils.scripts.test_notebook", "listed", "theirs"),
        script.Submodule(
            "accelerate.test_utils.scripts.external_deps.test_pippy", "listed", "theirs"
        ),
    ]
    lines = script.render_submodules(paths)
    assert (
        "| `accelerate.test_utils.scripts.external_deps.test_pippy`, "
        "`accelerate.test_utils.scripts.test_notebook` | listed | theirs |"
    ) in lines
