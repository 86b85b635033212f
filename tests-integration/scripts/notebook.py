"""notebook_launcher from a live interpreter: the training function forks into 2 processes."""

import torch

from accel import Accelerator, notebook_launcher


def training_function(scale):
    accelerator = Accelerator()
    value = torch.tensor([float(accelerator.process_index + 1) * scale])
    gathered = accelerator.gather(value)
    accelerator.print(f"NOTEBOOK gathered={gathered.tolist()} num={accelerator.num_processes}")


if __name__ == "__main__":
    notebook_launcher(training_function, args=(10.0,), num_processes=2)
    print("NOTEBOOK done", flush=True)
