"""Write the Accelerate checkpoints the switch tests load (needs ``pip install accelerate``).

Run from ``packages/accel/tests``::

    python data/accelerate/make_fixture.py one_process_bin
    torchrun --nproc_per_node 2 data/accelerate/make_fixture.py two_processes

Each run writes ``data/accelerate/<name>/`` with Accelerate's own ``save_state`` and
``data/accelerate/<name>.json``: the accelerate version, the state right after saving, and each
rank's losses and weights when Accelerate itself goes on training from there.
"""

from __future__ import annotations

import json
import pathlib
import random
import shutil
import sys

import accelerate
import numpy as np
import torch
from accelerate import Accelerator

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

import switch_training as run  # noqa: E402


def main(name: str) -> None:
    """Train, save with Accelerate, record what comes next."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=run.ACCUMULATION)
    random.seed(1 + accelerator.process_index)
    np.random.seed(2 + accelerator.process_index)
    objects = accelerator.prepare(*run.build())
    counter = run.Counter()
    accelerator.register_for_checkpointing(counter)
    run.train(accelerator, objects, run.STEPS_BEFORE)
    counter.value = 7
    folder = HERE / name
    if accelerator.is_main_process and folder.exists():
        shutil.rmtree(folder)
    accelerator.wait_for_everyone()
    saved = accelerator.save_state(str(folder), safe_serialization=not name.endswith("_bin"))
    record = {
        "accelerate": accelerate.__version__,
        "torch": torch.__version__,
        "save_state_returned": type(saved).__name__,
        "state": run.snapshot(accelerator, objects, counter),
        "draws": run.draws(),
        "losses_after": run.train(accelerator, objects, run.STEPS_AFTER),
        "weights_after": run.weights(accelerator, objects),
    }
    records = accelerate.utils.gather_object([record])
    if accelerator.is_main_process:
        text = json.dumps({"num_processes": accelerator.num_processes, "ranks": records}, indent=1)
        (HERE / f"{name}.json").write_text(text + "\n")
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1])
