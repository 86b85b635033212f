"""``install_as_accelerate()``, ``python -m accel.as_accelerate`` and ``accel launch --as_accelerate``.

Each check runs in a fresh interpreter: the alias changes ``sys.modules`` and ``sys.meta_path``
for the rest of a process. A real Accelerate may or may not be installed beside accel here; the
alias must win either way (the ecosystem session tests the pair side by side).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accel.accelerate_alias import ACCELERATE_API_VERSION, ALIAS_VERSION, AS_ACCELERATE_ENV
from accel_state import contract
from accel_state.testing.environ import without_launcher_variables

SCRIPT = Path(__file__).parent / "alias_scripts" / "report_alias.py"
TIMEOUT = 240


def run_python(code: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {**without_launcher_variables(os.environ), "OMP_NUM_THREADS": "1", **extra_env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        check=False,
    )


def test_the_alias_serves_accels_own_modules() -> None:
    completed = run_python(
        """
        import importlib.metadata, importlib.util, json, pickle, sys
        import accel
        accel.install_as_accelerate()
        accel.install_as_accelerate()  # a second call changes nothing
        import accelerate
        import accelerate.utils.modeling
        from accelerate.state import AcceleratorState
        from accelerate.utils import set_seed
        import accel.utils.modeling, accel.state
        try:
            import accelerate.no_such_module
            missing = "imported"
        except ModuleNotFoundError as error:
            missing = error.name
        print(json.dumps({
            "version": accelerate.__version__,
            "metadata": importlib.metadata.version("accelerate"),
            "dist_name": importlib.metadata.distribution("accelerate").metadata["Name"],
            "find_spec": importlib.util.find_spec("accelerate") is not None,
            "accelerator": accelerate.Accelerator is accel.Accelerator,
            "modeling": accelerate.utils.modeling is accel.utils.modeling,
            "modeling_name": accelerate.utils.modeling.__name__,
            "modeling_spec": accelerate.utils.modeling.__spec__.name,
            "state": AcceleratorState is accel.state.AcceleratorState,
            "set_seed": set_seed is accel.utils.set_seed,
            "sys_modules": sys.modules["accelerate.utils.modeling"] is accel.utils.modeling,
            "missing": missing,
            "pickled": pickle.loads(pickle.dumps(accelerate.DistributedType.NO)).value,
            "accel_version": accel.__version__,
        }))
        """
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert result["version"] == result["metadata"] == ALIAS_VERSION
    assert f"{ACCELERATE_API_VERSION}+accel.{result['accel_version']}" == ALIAS_VERSION
    assert result["dist_name"] == "accelerate"
    assert result["find_spec"] is True
    for key in ("accelerator", "modeling", "state", "set_seed", "sys_modules"):
        assert result[key] is True, key
    assert result["modeling_name"] == result["modeling_spec"] == "accel.utils.modeling"
    assert result["missing"] == "accelerate.no_such_module"
    assert result["pickled"] == "NO"


def test_swapping_a_name_on_a_module_path_reaches_the_code_that_uses_it() -> None:
    """transformers swaps ``check_device_map`` for a no-op around ``dispatch_model``, then back."""
    completed = run_python(
        """
        import json, torch
        import accel
        accel.install_as_accelerate()
        import accelerate.big_modeling
        from accelerate import dispatch_model
        import accel_ckpt.big_modeling.dispatch as domain

        def model():
            return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))

        original = accelerate.big_modeling.check_device_map
        accelerate.big_modeling.check_device_map = lambda *args, **kwargs: None
        swapped = domain.check_device_map is accelerate.big_modeling.check_device_map
        dispatch_model(model(), {"0": "cpu"}, main_device="cpu")  # one module not in the map
        accelerate.big_modeling.check_device_map = original
        try:
            dispatch_model(model(), {"0": "cpu"}, main_device="cpu")
            refused = ""
        except Exception as error:
            refused = type(error).__name__
        print(json.dumps({
            "swapped": swapped,
            "restored": domain.check_device_map is original,
            "refused_after": refused,
            "facade_untouched": accelerate.dispatch_model is accel.dispatch_model,
        }))
        """
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert result == {
        "swapped": True,
        "restored": True,
        "refused_after": "DeviceMapError",
        "facade_untouched": True,
    }


def test_a_removed_facade_comes_back_whole() -> None:
    """Importing ``accelerate`` again after ``sys.modules`` lost it gives the facade, not a blank."""
    completed = run_python(
        """
        import sys
        import accel
        accel.install_as_accelerate()
        del sys.modules["accelerate"]
        import accelerate
        print(accelerate.__version__, accelerate.Accelerator is accel.Accelerator)
        """
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == [ALIAS_VERSION, "True"]


@pytest.mark.parametrize("early", ["transformers", "accelerate"])
def test_too_late_is_an_error_that_says_what_to_do(early: str) -> None:
    """After transformers (or a real accelerate) is imported, the alias refuses, naming it."""
    completed = run_python(
        f"""
        import sys, types
        stand_in = types.ModuleType({early!r})
        stand_in.__file__ = "/site-packages/{early}/__init__.py"
        sys.modules[{early!r}] = stand_in  # as if the script imported it first
        import accel
        try:
            accel.install_as_accelerate()
        except accel.AliasError as error:
            print(error)
        else:
            print("no error")
        """
    )
    assert completed.returncode == 0, completed.stderr
    message = completed.stdout
    assert early in message
    assert "accel.install_as_accelerate()" in message and "--as-accelerate" in message


def test_the_start_up_hook_reads_the_environment_variable() -> None:
    assert AS_ACCELERATE_ENV == contract.AS_ACCELERATE
    code = "import accelerate; print(accelerate.__version__)"
    on = run_python(code, **{AS_ACCELERATE_ENV: "1"})
    assert on.returncode == 0, on.stderr
    assert on.stdout.strip() == ALIAS_VERSION
    off = run_python("import sys; print('accelerate' in sys.modules)", **{AS_ACCELERATE_ENV: "0"})
    assert off.stdout.strip() == "False"


def test_python_m_as_accelerate_runs_a_script_with_its_arguments(tmp_path: Path) -> None:
    out = tmp_path / "record"
    env = {**without_launcher_variables(os.environ), "EXIT_WITH": "3", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "accel.as_accelerate", str(SCRIPT), str(out), "--flag"]
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=TIMEOUT, env=env, check=False
    )
    assert completed.returncode == 3, completed.stderr  # the script's own exit status
    record = json.loads(Path(f"{out}.0").read_text())
    assert record["argv"] == [str(out), "--flag"]
    assert record["version"] == record["metadata"] == ALIAS_VERSION
    assert record["same_accelerator"] and record["utils_is_accel"]
    usage = subprocess.run(
        [sys.executable, "-m", "accel.as_accelerate"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        check=False,
    )
    assert usage.returncode == 2 and "usage: python -m accel.as_accelerate" in usage.stderr


def test_accel_launch_as_accelerate_reaches_every_worker_and_restarted_ones(
    tmp_path: Path,
) -> None:
    """Two workers; the first attempt fails, torch elastic restarts both, each has the alias."""
    out = tmp_path / "record"
    accel = str(Path(sys.executable).with_name("accel"))
    env = {
        **without_launcher_variables(os.environ),
        "FAIL_FIRST_ATTEMPT": "1",
        "OMP_NUM_THREADS": "1",
    }
    command = [
        accel,
        "launch",
        "--as-accelerate",
        "--cpu",
        "--num_processes",
        "2",
        "--max_restarts",
        "1",
        str(SCRIPT),
        str(out),
    ]
    completed = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        check=False,
        start_new_session=True,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-6000:]
    for rank in (0, 1):
        record = json.loads(Path(f"{out}.{rank}").read_text())
        assert record["restart"] == 1
        assert record["version"] == record["metadata"] == ALIAS_VERSION
        assert record["same_accelerator"] and record["utils_is_accel"]


def test_notebook_launcher_workers_inherit_the_alias(tmp_path: Path) -> None:
    completed = run_python(
        f"""
        import json, os
        import accel
        accel.install_as_accelerate()
        from accelerate import notebook_launcher

        def work(folder):
            import accelerate, accel
            from accelerate import PartialState
            state = PartialState()
            with open(os.path.join(folder, f"rank{{state.process_index}}"), "w") as handle:
                json.dump([accelerate.__version__, accelerate.Accelerator is accel.Accelerator], handle)

        notebook_launcher(work, ({str(tmp_path)!r},), num_processes=2)
        """
    )
    assert completed.returncode == 0, completed.stderr[-6000:]
    for rank in (0, 1):
        version, same = json.loads((tmp_path / f"rank{rank}").read_text())
        assert version == ALIAS_VERSION and same is True


def test_launcher_exports_accelerates_variables_to_a_plain_script(tmp_path: Path) -> None:
    """Without --as_accelerate too: ACCELERATE_MIXED_PRECISION and friends reach the workers."""
    script = tmp_path / "env_probe.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ['ACCELERATE_MIXED_PRECISION', 'ACCELERATE_USE_CPU', 'ACCEL_AS_ACCELERATE']\n"
        "open(sys.argv[1] + os.environ['RANK'], 'w').write(json.dumps({k: os.environ.get(k) for k in keys}))\n"
    )
    accel = str(Path(sys.executable).with_name("accel"))
    command = [accel, "launch", "--cpu", "--num_processes", "2", "--mixed_precision", "bf16"]
    completed = subprocess.run(
        [*command, str(script), str(tmp_path / "env")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**without_launcher_variables(os.environ), "OMP_NUM_THREADS": "1"},
        check=False,
        start_new_session=True,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"env{rank}").read_text())
        assert seen == {
            "ACCELERATE_MIXED_PRECISION": "bf16",
            "ACCELERATE_USE_CPU": "True",
            "ACCEL_AS_ACCELERATE": None,
        }


def test_accelerator_reads_accelerates_variables_set_by_hand() -> None:
    """``ACCELERATE_MIXED_PRECISION=bf16 python train.py``, as with Accelerate."""
    completed = run_python(
        """
        from accel import Accelerator
        accelerator = Accelerator()
        print(accelerator.mixed_precision, str(accelerator.state.dynamo_plugin.backend).lower())
        """,
        ACCELERATE_MIXED_PRECISION="bf16",
        ACCELERATE_DYNAMO_BACKEND="EAGER",
        ACCELERATE_USE_CPU="True",
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert completed.stdout.split() == ["bf16", "eager"]
