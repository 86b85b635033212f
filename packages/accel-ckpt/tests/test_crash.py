"""SIGKILL during saves never damages the previous checkpoint or exposes a partial one."""

import json
import os
import subprocess
import sys
from pathlib import Path

from ckpt_helpers import fresh_setup, same, snapshot

from accel_ckpt import ProjectConfiguration, is_complete, load_state, save_state

DRIVER = Path(__file__).with_name("crash_driver.py")


def loaded(
    folder: Path | None = None, config: ProjectConfiguration | None = None
) -> tuple[dict, Path]:
    target = fresh_setup()
    result = load_state(folder, project_config=config, **target, load_rng_states=False)
    return snapshot(target), result.path


def public_entries(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if not p.name.startswith(".")]


def test_kill_at_many_points_and_random_moments(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path), "16", "4", "20240611"],
        check=True,
        timeout=240,
        env=env,
    )
    results = json.loads((tmp_path / "results.json").read_text())
    state_a, _ = loaded(tmp_path / "template" / "fixed")
    state_b, _ = loaded(tmp_path / "dry" / "fixed")
    assert not same(state_a["models"], state_b["models"])
    seen = {"fixed": set(), "project": set()}
    for case in results["points"]:
        assert case["killed"], case
        folder = tmp_path / case["case"]
        state, _ = loaded(folder / "fixed")
        assert same(state, state_a) or same(state, state_b), case
        seen["fixed"].add("A" if same(state, state_a) else "B")
        checkpoints = folder / "project" / "checkpoints"
        assert all(is_complete(path) for path in public_entries(checkpoints)), case
        config = ProjectConfiguration(
            project_dir=str(folder / "project"), automatic_checkpoint_naming=True
        )
        state, path = loaded(config=config)
        assert path.name in ("checkpoint_1", "checkpoint_2"), case
        assert same(state, state_b if path.name == "checkpoint_2" else state_a), case
        seen["project"].add(path.name)
    # The kill points covered both sides of each commit.
    assert seen == {"fixed": {"A", "B"}, "project": {"checkpoint_1", "checkpoint_2"}}

    for case in results["random"]:
        folder = tmp_path / case["case"]
        last = case["last_reported"]
        config = ProjectConfiguration(
            project_dir=str(folder / "project"), automatic_checkpoint_naming=True
        )
        for where in ({"folder": folder / "fixed"}, {"config": config}):
            state, _ = loaded(**where)
            values = {
                float(t.flatten()[0]) for t in state["models"][0].values() if t.is_floating_point()
            }
            assert len(values) == 1, case
            assert values.pop() in (last, last + 1), case

    # Saving again over a killed save cleans its leftovers.
    folder = tmp_path / results["points"][3]["case"]
    target = fresh_setup()
    save_state(folder / "fixed", **target)
    config = ProjectConfiguration(
        project_dir=str(folder / "project"), automatic_checkpoint_naming=True, total_limit=2
    )
    load_state(project_config=config, **fresh_setup())
    save_state(project_config=config, **target)
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []
    assert all(not p.name.startswith(".") for p in (folder / "project" / "checkpoints").iterdir())
    assert len(public_entries(folder / "project" / "checkpoints")) == 2
