"""Exact resume, bit for bit: at an epoch boundary and mid-epoch, in the same process and a new one.

``epoch_resume_script.py`` trains with shuffling, dropout, AdamW, a LambdaLR scheduler and a
registered object, saving after each of the first three epochs and in the middle of the fourth.
Every resumed run must produce the uninterrupted run's losses, learning rates and weights.
"""

import json
import pathlib

import pytest

from accel_state.testing import run_torchrun

HERE = pathlib.Path(__file__).parent
SCRIPT = str(HERE / "epoch_resume_script.py")
MID = 2  # the batch of epoch 3 after which the mid-epoch checkpoint is saved


def run(project: pathlib.Path, world_size: int, tag: str, *options: str) -> list[dict]:
    """Run the script on ``world_size`` processes; every process's results."""
    command = [SCRIPT, str(project), "--tag", tag, *options]
    done = run_torchrun(command, nproc_per_node=world_size, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    folder = project / "results" / tag
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world_size)]


def from_(records: list, epoch: int, batch: int) -> list:
    """The records from ``batch`` of ``epoch`` on."""
    return [record for record in records if (record[0], record[1]) >= (epoch, batch)]


@pytest.mark.parametrize("world_size", [1, 2], ids=lambda n: f"{n}proc")
def test_resume_at_epoch_boundary_and_mid_epoch_is_exact(tmp_path, world_size):
    trained = run(tmp_path, world_size, "train", "--phase", "train")
    checkpoints = tmp_path / "checkpoints"
    boundary = run(
        tmp_path,
        world_size,
        "new_boundary",
        *("--phase", "resume", "--seed", "99", "--checkpoint", str(checkpoints / "checkpoint_2")),
    )
    newest = run(tmp_path, world_size, "new_mid", "--phase", "resume", "--seed", "98")
    for rank in range(world_size):
        runs = trained[rank]
        assert runs["checkpoints"] == ["checkpoint_2", "checkpoint_3"]  # total_limit=2
        full = runs["uninterrupted"]
        assert len(full["records"]) == 5 * 10 // world_size
        expected = {
            # checkpoint 2: saved after epoch 2, so training goes on with epoch 3
            "same_boundary": from_(full["records"], 3, 0),
            "new_boundary": from_(full["records"], 3, 0),
            # checkpoint 3 (the newest): saved after batch MID of epoch 3
            "same_mid": from_(full["records"], 3, MID + 1),
            "same_mid_skip_first_batches": from_(full["records"], 3, MID + 1),
            "new_mid": from_(full["records"], 3, MID + 1),
        }
        resumed = {
            "same_boundary": runs["same_boundary"],
            "same_mid": runs["same_mid"],
            "same_mid_skip_first_batches": runs["same_mid_skip_first_batches"],
            "new_boundary": boundary[rank]["resumed"],
            "new_mid": newest[rank]["resumed"],
        }
        for name, result in resumed.items():
            assert result["records"] == expected[name], f"{name}, rank {rank}"
            assert result["weights"] == full["weights"], f"{name}, rank {rank}"
