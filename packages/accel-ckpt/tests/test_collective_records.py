"""save_state and load_state are recorded as collectives at the caller's line, background saves too."""

import pathlib

import torch

from accel_ckpt import load_state, save_state
from accel_ops import records

HERE = pathlib.Path(__file__).name


def _line(marker: str) -> int:
    lines = pathlib.Path(__file__).read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if text.endswith(marker))


def test_saves_and_loads_are_recorded_where_the_user_called_them(tmp_path):
    records.reset_records()
    model = torch.nn.Linear(2, 2)
    handle = save_state(tmp_path / "c", models=[model], blocking=False)  # the save
    handle.wait()
    load_state(tmp_path / "c", models=[model])  # the load
    kept = records.records()
    assert [(entry.op, entry.state) for entry in kept] == [
        ("save_state", "done"),
        ("save_state (background)", "done"),
        ("load_state", "done"),
    ]
    save_line, load_line = _line("# the save"), _line("# the load")
    assert [entry.site for entry in kept] == [f"{HERE}:{save_line}"] * 2 + [f"{HERE}:{load_line}"]
    assert kept[1].phase.startswith("Committing checkpoint")  # the last step it went through
