"""Accelerate's module paths are doors written from one table (packages/accel/doors.toml).

``scripts/doors.py --check`` (run by ``nox -s lint``) passes on the repository and fails, naming
the file, on a hand edit; every name of the table is, on its door, the object its source module
holds; the doors that forward patches still do; ``import accel.utils`` imports none of them.
"""

from __future__ import annotations

import importlib
import io
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOOR = Path("packages/accel/src/accel/utils/random.py")


@pytest.fixture
def doors(repo_script: Any) -> Any:
    return repo_script("doors")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the table and of accel's sources: what the check reads."""
    source = ROOT / "packages" / "accel"
    shutil.copytree(
        source / "src",
        tmp_path / "packages" / "accel" / "src",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(source / "doors.toml", tmp_path / "packages" / "accel" / "doors.toml")
    return tmp_path


def run_check(doors: Any, root: Path) -> tuple[int, str]:
    out = io.StringIO()
    return doors.check(root, out=out), out.getvalue()


def test_the_lint_check_passes_on_the_repository() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "doors.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "doors differing from packages/accel/doors.toml: 0" in done.stdout


def test_a_hand_edit_of_a_door_fails_the_check_naming_the_file(doors, checkout):
    door = checkout / DOOR
    door.write_text(door.read_text() + "from accel_data import skip_first_batches as skip\n")
    status, out = run_check(doors, checkout)
    assert status == 1
    assert f"{DOOR}: differs from what the table generates" in out
    assert "+from accel_data import skip_first_batches as skip" not in out  # the diff: table's side
    assert "-from accel_data import skip_first_batches as skip" in out
    assert "python scripts/doors.py --write" in out
    assert out.count("differs from what the table generates") == 1

    assert doors.write(checkout, out=io.StringIO()) == 0
    assert run_check(doors, checkout)[0] == 0


def test_a_name_added_to_the_table_reaches_its_door_through_write(doors, checkout):
    table = checkout / doors.TABLE
    text = table.read_text()
    old = 'from.accel_data = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]'
    assert old in text
    table.write_text(text.replace(old, old[:-1] + ', "skip_first_batches"]'))
    status, out = run_check(doors, checkout)
    assert status == 1 and f"{DOOR}: differs" in out
    assert "+from accel_data import skip_first_batches as skip_first_batches" in out

    doors.write(checkout, out=io.StringIO())
    written = (checkout / DOOR).read_text()
    assert "from accel_data import skip_first_batches as skip_first_batches\n" in written
    assert '    "skip_first_batches",\n' in written  # listed in __all__ too
    assert written.startswith('"""Accelerate\'s ``accelerate.utils.random`` module path')


def test_a_door_module_the_table_leaves_out_fails_the_check(doors, checkout):
    new = checkout / "packages/accel/src/accel/utils/new_path.py"
    new.write_text('"""A new module path."""\n')
    status, out = run_check(doors, checkout)
    assert status == 1
    assert "packages/accel/src/accel/utils/new_path.py: is a door (accel.utils.new_path" in out


def test_a_door_added_to_the_table_is_written_with_its_doc(doors, checkout):
    table = checkout / doors.TABLE
    table.write_text(
        table.read_text()
        + '\n[doors."accel.utils.new_path"]\ndoc = "A new module path."\n'
        + 'from.accel_ops = ["gather"]\nserve_as_door = ["accel.amp"]\n'
    )
    new = checkout / "packages/accel/src/accel/utils/new_path.py"
    status, out = run_check(doors, checkout)
    assert status == 1 and "packages/accel/src/accel/utils/new_path.py: is missing" in out

    doors.write(checkout, out=io.StringIO())
    written = new.read_text()
    assert written.startswith('"""A new module path."""\n')
    assert "from accel_ops import gather as gather\n" in written
    assert 'serve_as_door(__name__, "accel.amp")\n' in written
    assert run_check(doors, checkout)[0] == 0


def test_the_table_refuses_a_name_bound_twice_in_one_door(doors):
    with pytest.raises(doors.TableError, match="'gather' is bound twice"):
        doors.parse_table(
            '[doors."accel.x"]\nfrom.accel_ops = ["gather"]\nunlisted.a = ["gather"]\n'
        )
    with pytest.raises(doors.TableError, match="unknown keys"):
        doors.parse_table('[doors."accel.x"]\nfrom.accel_ops = ["gather"]\nexports = []\n')


def _resolved(table: Any, module: str) -> list[tuple[str, Any, Any]]:
    """``(name, on the door, on its source)`` for each name the table gives door ``module``."""
    door = importlib.import_module(module)
    found = []
    for name in table.resolved(module):
        source = importlib.import_module(name.source)
        expected = source if name.whole_module else getattr(source, name.original)
        ours = getattr(door, name.name)
        shadow = sys.modules.get(f"{module}.{name.name}")
        if ours is shadow and shadow is not None:
            # accel.utils.tqdm: importing the module path replaced the package's attribute with
            # the (callable) module, as in Accelerate; the module holds the function.
            ours = getattr(shadow, name.name)
        found.append((name.name, ours, expected))
    return found


def test_every_name_of_the_table_is_on_its_door_the_object_of_its_source(doors):
    table = doors.load_table(ROOT)
    wrong = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # accel.memory_utils warns on import
        for module in table.doors:
            for name, ours, expected in _resolved(table, module):
                if ours is not expected:
                    wrong.append(f"{module}.{name}")
    assert not wrong
    assert sum(len(table.resolved(module)) for module in table.doors) > 800  # not vacuous


def test_the_doors_that_forward_patches_still_do(doors):
    from accel.patch_forwarding import PatchForwardingModule

    table = doors.load_table(ROOT)
    serving = {m: d.serve_as_door for m, d in table.doors.items() if d.serve_as_door is not None}
    assert len(serving) >= 20
    for module, domain in serving.items():
        door = importlib.import_module(module)
        assert type(door) is PatchForwardingModule, module
        assert door.__domain__ == domain, module


def test_accel_utils_has_every_availability_check_and_imports_nothing_up_front(doors):
    import accel.utils
    import accel.utils.imports
    from accel.availability import AVAILABILITY_CHECKS

    assert set(AVAILABILITY_CHECKS) <= set(accel.utils.__all__)
    assert set(AVAILABILITY_CHECKS) <= set(vars(accel.utils.imports))
    sources = sorted({name.source for name in doors.load_table(ROOT).resolved("accel.utils")})
    code = (
        "import sys, accel.utils\n"
        f"print(sorted(set({sources!r}) & set(sys.modules)), 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[] False"
